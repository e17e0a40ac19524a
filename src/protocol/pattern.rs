//! Which job names a GetJob asks for: one GLOB pattern (`*`, `www-prod/*`), or
//! a comma-separated list of exact names. The GLOB matcher here follows
//! SQLite's `GLOB` operator exactly, so that a waiter held in memory and the
//! dequeue query in the store agree on every name.

use super::{JobError, MAX_NAME_BYTES};

/// A name filter from a GetJob(s) `name` parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamePattern {
    /// A GLOB pattern, matched as SQLite's `name GLOB pattern`.
    Glob(String),
    /// Exact names, from a comma-separated list of two or more.
    List(Vec<String>),
}

impl NamePattern {
    /// Reads a `name` parameter the way Bedrock does: split at commas,
    /// trimmed, empty items dropped; two or more items are a list of exact
    /// names, anything else is one GLOB pattern taken as written.
    pub fn parse(name: &str) -> Result<Self, JobError> {
        if name.is_empty() {
            return Err(JobError::Missing("name"));
        }
        if name.len() > 64 * MAX_NAME_BYTES {
            return Err(JobError::Malformed("name"));
        }
        if super::text::has_control(name) {
            return Err(JobError::ControlCharacter("name"));
        }
        let items: Vec<String> = name
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
            .map(str::to_string)
            .collect();
        if items.len() > 1 {
            Ok(NamePattern::List(items))
        } else {
            if name.len() > MAX_NAME_BYTES {
                return Err(JobError::Malformed("name"));
            }
            Ok(NamePattern::Glob(name.to_string()))
        }
    }

    /// Whether a job called `name` is wanted.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            NamePattern::Glob(pattern) => glob_matches(pattern, name),
            NamePattern::List(names) => names.iter().any(|n| n == name),
        }
    }
}

/// SQLite's `text GLOB pattern`: `*` any run, `?` one character, `[...]` a
/// set with ranges and `^` negation, case-sensitive, no escape character. A
/// set with no closing `]` matches nothing.
pub fn glob_matches(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    let (mut p, mut t) = (0usize, 0usize);
    // Where to resume after the last `*`: pattern index after it, and the
    // text index it currently absorbs up to.
    let mut resume: Option<(usize, usize)> = None;
    loop {
        if p < pattern.len() {
            let advanced = match pattern[p] {
                '*' => {
                    resume = Some((p + 1, t));
                    p += 1;
                    continue;
                }
                '?' if t < text.len() => Some(p + 1),
                '[' if t < text.len() => match match_set(&pattern, p, text[t]) {
                    Some((true, next)) => Some(next),
                    _ => None,
                },
                c if t < text.len() && text[t] == c => Some(p + 1),
                _ => None,
            };
            if let Some(next) = advanced {
                p = next;
                t += 1;
                continue;
            }
        } else if t == text.len() {
            return true;
        }
        match resume {
            Some((after_star, absorbed)) if absorbed < text.len() => {
                resume = Some((after_star, absorbed + 1));
                p = after_star;
                t = absorbed + 1;
            }
            _ => return false,
        }
    }
}

/// Matches `c` against the set that opens at `pattern[open]` (a `[`).
/// Returns whether it matched and the index after the closing `]`, or `None`
/// when the set is never closed.
fn match_set(pattern: &[char], open: usize, c: char) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let mut invert = false;
    let mut seen = false;
    if pattern.get(i) == Some(&'^') {
        invert = true;
        i += 1;
    }
    if pattern.get(i) == Some(&']') {
        seen |= c == ']';
        i += 1;
    }
    let mut prior: Option<char> = None;
    loop {
        let c2 = *pattern.get(i)?;
        if c2 == ']' {
            return Some((seen != invert, i + 1));
        }
        let next = pattern.get(i + 1).copied();
        match (c2, prior, next) {
            ('-', Some(low), Some(high)) if high != ']' => {
                seen |= low <= c && c <= high;
                prior = None;
                i += 2;
            }
            _ => {
                seen |= c == c2;
                prior = Some(c2);
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_basics() {
        assert!(glob_matches("*", ""));
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("www-prod/*", "www-prod/SendEmail"));
        assert!(!glob_matches("www-prod/*", "www-stag/SendEmail"));
        assert!(glob_matches("a?c", "abc"));
        assert!(!glob_matches("a?c", "ac"));
        assert!(glob_matches("[a-c]x", "bx"));
        assert!(!glob_matches("[^a-c]x", "bx"));
        assert!(glob_matches("[]]", "]"));
        assert!(!glob_matches("[abc", "a"));
        assert!(glob_matches("*.[ch]", "main.c"));
        assert!(!glob_matches("Foo*", "foo"));
    }

    #[test]
    fn names_split_like_bedrock() {
        assert_eq!(
            NamePattern::parse("*").unwrap(),
            NamePattern::Glob("*".into())
        );
        assert_eq!(
            NamePattern::parse("a, b").unwrap(),
            NamePattern::List(vec!["a".into(), "b".into()])
        );
        // A single item keeps its comma and is a GLOB.
        assert_eq!(
            NamePattern::parse("a,").unwrap(),
            NamePattern::Glob("a,".into())
        );
        assert_eq!(NamePattern::parse(""), Err(JobError::Missing("name")));
        assert_eq!(
            NamePattern::parse("a*\n"),
            Err(JobError::ControlCharacter("name"))
        );
        assert!(NamePattern::parse("a, b").unwrap().matches("b"));
        assert!(!NamePattern::parse("a, b").unwrap().matches("a, b"));
    }
}
