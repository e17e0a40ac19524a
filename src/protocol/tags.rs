//! Tags and tracking, qless's labels on jobs: what a tag may be, the change
//! of a job's tags as a checked command, and what a job carries besides its
//! own fields.
//!
//! A tag is 1 to [`MAX_TAG_CHARS`] characters, with no control character
//! (see [`super::text::is_control`]) and no space at either end; a job has
//! at most [`MAX_TAGS`]. A list of tags is deduplicated, keeping the first
//! of each.

use super::{JobError, JobId};

/// The most tags a job has.
pub const MAX_TAGS: usize = 32;

/// The longest tag, in characters.
pub const MAX_TAG_CHARS: usize = 64;

/// The rules of a tag, as error messages end with them.
const RULES: &str = "a tag is 1 to 64 characters, without control characters or spaces at its ends, and a job has at most 32";

/// What a job carries besides its own fields: its tags and whether an
/// operator tracks it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// Its tags, in byte order.
    pub tags: Vec<String>,
    /// Whether it is tracked.
    pub tracked: bool,
}

/// A change of a job's tags: `add` first, then `remove`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagChange {
    /// Which job.
    pub id: JobId,
    /// Tags to add (those it has already are kept once).
    pub add: Vec<String>,
    /// Tags to remove (those it does not have are ignored).
    pub remove: Vec<String>,
}

/// Checks one tag; `where_` says which (e.g. `tag 3 of add`) in the error.
pub fn check_tag(tag: &str, where_: &str) -> Result<(), JobError> {
    let chars = tag.chars().count();
    let why = if chars == 0 {
        "is empty"
    } else if chars > MAX_TAG_CHARS {
        "is longer than 64 characters"
    } else if super::text::has_control(tag) {
        "holds a control character"
    } else if tag.starts_with(char::is_whitespace) || tag.ends_with(char::is_whitespace) {
        "begins or ends with a space"
    } else {
        return Ok(());
    };
    Err(JobError::BadTags(format!("{where_} {why}; {RULES}")))
}

/// Checks a list of tags given under `param` and deduplicates it (keeping
/// the first of each): every tag valid, at most [`MAX_TAGS`] distinct.
pub fn check_tags(param: &str, tags: Vec<String>) -> Result<Vec<String>, JobError> {
    let mut out: Vec<String> = Vec::with_capacity(tags.len().min(MAX_TAGS));
    for (index, tag) in tags.into_iter().enumerate() {
        check_tag(&tag, &format!("tag {} of {param}", index + 1))?;
        if !out.contains(&tag) {
            if out.len() == MAX_TAGS {
                return Err(JobError::BadTags(format!(
                    "{param} holds more than {MAX_TAGS} distinct tags; {RULES}"
                )));
            }
            out.push(tag);
        }
    }
    Ok(out)
}

/// Reads a list of tags given as JSON text (a header of the Bedrock port):
/// a JSON array of strings, checked as [`check_tags`] does.
pub fn parse_tags(param: &str, text: &str) -> Result<Vec<String>, JobError> {
    match serde_json::from_str::<Vec<String>>(text) {
        Ok(tags) => check_tags(param, tags),
        Err(_) => Err(JobError::BadTags(format!(
            "{param} is not a JSON array of strings, such as [\"billing\",\"urgent\"]"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(list: &[&str]) -> Vec<String> {
        list.iter().map(|t| t.to_string()).collect()
    }

    #[test]
    fn tags_are_short_printable_and_deduplicated() {
        assert_eq!(
            check_tags("tags", tags(&["a", "b", "a", "é中 x"])).unwrap(),
            tags(&["a", "b", "é中 x"])
        );
        assert!(check_tags("tags", tags(&[&"x".repeat(64)])).is_ok());
        for bad in ["", &"x".repeat(65), "a\nb", "a\u{1b}b", " a", "a ", "\t"] {
            let error = check_tags("tags", tags(&["ok", bad])).unwrap_err();
            assert_eq!(error.status(), 402, "{bad:?}");
            assert!(error.to_string().contains("tag 2 of tags"), "{error}");
        }
        let many: Vec<String> = (0..33).map(|i| format!("t{i}")).collect();
        assert!(check_tags("tags", many.clone()).is_err());
        // Duplicates do not count against the limit.
        let mut repeated = many[..32].to_vec();
        repeated.extend(many[..32].iter().cloned());
        assert_eq!(check_tags("tags", repeated).unwrap().len(), 32);
    }

    #[test]
    fn a_header_holds_a_json_array_of_strings() {
        assert_eq!(
            parse_tags("tags", r#"["a","b"]"#).unwrap(),
            tags(&["a", "b"])
        );
        for bad in ["a", "[1]", r#"{"a":1}"#, "[\"a\""] {
            assert!(parse_tags("tags", bad).is_err(), "{bad}");
        }
    }
}
