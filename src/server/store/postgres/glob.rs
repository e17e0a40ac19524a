//! Name patterns in PostgreSQL's SQL. PostgreSQL has no `GLOB`: a GLOB
//! becomes an anchored regular expression that matches exactly the names
//! SQLite's `GLOB` (and [`crate::protocol::pattern::glob_matches`]) match,
//! and a GLOB's literal prefix also becomes a range on the name index (the
//! names are in the "C" collation, ordered by bytes as in SQLite).

use postgres::types::ToSql;

use crate::protocol::NamePattern;
use crate::server::store::listing::{WILDCARDS, after_prefix};

/// Parameters of a statement built piece by piece.
#[derive(Default)]
pub(super) struct Params(Vec<Box<dyn ToSql + Sync + Send>>);

impl Params {
    /// Adds a parameter; returns its placeholder (`$N`).
    pub(super) fn push(&mut self, value: impl ToSql + Sync + Send + 'static) -> String {
        self.0.push(Box::new(value));
        format!("${}", self.0.len())
    }

    /// The parameters as the client takes them.
    pub(super) fn refs(&self) -> Vec<&(dyn ToSql + Sync)> {
        self.0
            .iter()
            .map(|p| p.as_ref() as &(dyn ToSql + Sync))
            .collect()
    }
}

/// The anchored regular expression (PostgreSQL's `~`) matching what the
/// GLOB matches, or `None` for a GLOB that matches nothing (a set with no
/// closing `]`).
pub(super) fn glob_regex(glob: &str) -> Option<String> {
    let chars: Vec<char> = glob.chars().collect();
    let mut out = String::from("^");
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '[' => {
                let (set, close) = set_regex(&chars, i)?;
                out.push_str(&set);
                i = close;
            }
            c => out.push_str(&literal(c)),
        }
        i += 1;
    }
    out.push('$');
    Some(out)
}

/// The bracket expression for the set that opens at `chars[open]`, read
/// exactly as SQLite (and [`crate::protocol::pattern::glob_matches`]) reads
/// it: `^` first negates; a `]` first is a member; `a-z` is a range, after
/// which a `-` is a member again; a reversed range `z-a` matches only its
/// first character; no escapes. Returns it with the index of the closing
/// `]`, or `None` for a set never closed (which matches nothing).
fn set_regex(chars: &[char], open: usize) -> Option<(String, usize)> {
    let mut i = open + 1;
    let mut set = String::from("[");
    if chars.get(i) == Some(&'^') {
        set.push('^');
        i += 1;
    }
    if chars.get(i) == Some(&']') {
        set.push_str(&set_member(']'));
        i += 1;
    }
    let mut prior: Option<char> = None;
    loop {
        let c = *chars.get(i)?;
        if c == ']' {
            set.push(']');
            return Some((set, i));
        }
        let next = chars.get(i + 1).copied();
        match (c, prior, next) {
            ('-', Some(low), Some(high)) if high != ']' => {
                // `low` is a member already; the rest of the range, if any.
                if low < high {
                    set.push_str(&format!("{}-{}", set_member(low), set_member(high)));
                }
                prior = None;
                i += 2;
            }
            _ => {
                set.push_str(&set_member(c));
                prior = Some(c);
                i += 1;
            }
        }
    }
}

/// A character outside a set, matched as itself.
fn literal(c: char) -> String {
    if c.is_ascii_punctuation() {
        format!("\\{c}")
    } else {
        c.to_string()
    }
}

/// A character inside a bracket set, matched as itself (backslash escapes
/// work inside sets in PostgreSQL's regular expressions).
fn set_member(c: char) -> String {
    if matches!(c, '\\' | ']' | '[' | '^' | '-') {
        format!("\\{c}")
    } else {
        c.to_string()
    }
}

/// The condition on column `name` that `pattern` makes, its parameters
/// added to `params`: an equality, a list, or the GLOB's regular
/// expression with a range on its literal prefix.
pub(super) fn name_condition(pattern: &NamePattern, params: &mut Params) -> String {
    match pattern {
        NamePattern::List(names) => {
            format!("name = ANY({}::text[])", params.push(names.clone()))
        }
        NamePattern::Glob(glob) => {
            let prefix: &str = glob.split(WILDCARDS).next().unwrap_or_default();
            if prefix.len() == glob.len() {
                return format!("name = {}", params.push(glob.clone()));
            }
            let Some(regex) = glob_regex(glob) else {
                return "FALSE".into();
            };
            let mut condition = format!("name ~ {}", params.push(regex));
            if !prefix.is_empty() {
                condition.push_str(&format!(" AND name >= {}", params.push(prefix.to_string())));
                if let Some(end) = after_prefix(prefix) {
                    condition.push_str(&format!(" AND name < {}", params.push(end)));
                }
            }
            condition
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literal_names_and_wildcards_translate() {
        assert_eq!(glob_regex("a*").unwrap(), "^a.*$");
        assert_eq!(glob_regex("a.b?c").unwrap(), "^a\\.b.c$");
        assert_eq!(glob_regex("www-prod/*").unwrap(), "^www\\-prod\\/.*$");
        assert_eq!(glob_regex("[^a-c]x").unwrap(), "^[^aa-c]x$");
        assert_eq!(glob_regex("[]x]").unwrap(), "^[\\]x]$");
        assert_eq!(glob_regex("[a\\]").unwrap(), "^[a\\\\]$");
        assert_eq!(glob_regex("[a-]").unwrap(), "^[a\\-]$");
        assert!(glob_regex("[abc").is_none());
    }

    /// Patterns with sets, ranges, dashes, brackets and regular
    /// expressions' metacharacters, matched by PostgreSQL's own regular
    /// expressions (on the project's machines it runs on 127.0.0.1:5432;
    /// nothing is written) against names over the same characters: every
    /// answer is the waiters' matcher's (SQLite's GLOB).
    #[test]
    fn every_translated_pattern_matches_what_sqlites_glob_matches() {
        use crate::protocol::pattern::glob_matches;
        let patterns = [
            "[a-c-e]",
            "[a-b-c]",
            "[z-a]",
            "[a--]",
            "[]-a]",
            "[]]",
            "[^]]",
            "[^a-c]",
            "[-a]",
            "[a-]",
            "[\\]",
            "[[]",
            "[.]",
            "[^-]",
            "a*b?",
            "*[x-z]",
            "[a-c]*-",
            "a.b",
            "a\\b",
            "(a|b)",
            "a+",
            "[[:alpha:]]",
            "^a$",
            "é[é-ê]",
            "[abc",
            "*",
            "?",
            "[]",
        ];
        let names = [
            "a", "b", "c", "d", "e", "z", "-", "]", "[", "\\", ".", "^", "x", "ab", "axb", "a-",
            "b-", "a.b", "a\\b", "(a|b)", "a+", "aa", "^a$", "éé", "éê", "ê", "", "y", ":",
        ];
        let results = std::thread::spawn(move || {
            let mut client = postgres::Client::connect(
                "postgres://postgres@127.0.0.1:5432/postgres",
                postgres::NoTls,
            )
            .expect("PostgreSQL on 127.0.0.1:5432 (trust authentication for postgres)");
            let mut wrong = Vec::new();
            for pattern in patterns {
                for name in names {
                    let ours = match glob_regex(pattern) {
                        Some(regex) => client
                            .query_one("SELECT $1::text ~ $2::text", &[&name, &regex])
                            .unwrap_or_else(|e| panic!("{pattern:?} as {regex:?}: {e}"))
                            .get::<_, bool>(0),
                        None => false,
                    };
                    if ours != glob_matches(pattern, name) {
                        wrong.push(format!("{name:?} GLOB {pattern:?}: PostgreSQL says {ours}"));
                    }
                }
            }
            wrong
        })
        .join()
        .unwrap();
        assert!(results.is_empty(), "{results:#?}");
    }
}
