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
                // SQLite: `[^...]` negates; a `]` right after `[` or `[^`
                // is a member; `a-z` is a range; the set ends at the next
                // `]`. No escapes.
                let mut j = i + 1;
                let mut set = String::from("[");
                if chars.get(j) == Some(&'^') {
                    set.push('^');
                    j += 1;
                }
                let first = j;
                loop {
                    let c = *chars.get(j)?;
                    if c == ']' && j > first {
                        break;
                    }
                    if c == '-' && j > first && chars.get(j + 1).is_some_and(|&n| n != ']') {
                        set.push('-');
                    } else {
                        set.push_str(&set_member(c));
                    }
                    j += 1;
                }
                set.push(']');
                out.push_str(&set);
                i = j;
            }
            c => out.push_str(&literal(c)),
        }
        i += 1;
    }
    out.push('$');
    Some(out)
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
        assert_eq!(glob_regex("[^a-c]x").unwrap(), "^[^a-c]x$");
        assert_eq!(glob_regex("[]x]").unwrap(), "^[\\]x]$");
        assert_eq!(glob_regex("[a\\]").unwrap(), "^[a\\\\]$");
        assert_eq!(glob_regex("[a-]").unwrap(), "^[a\\-]$");
        assert!(glob_regex("[abc").is_none());
    }
}
