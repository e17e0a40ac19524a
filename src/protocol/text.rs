//! Characters that must never reach a log line or a terminal as they are:
//! they could end a line early and forge the next one (`\n`, `\r`, U+2028),
//! move the cursor or recolour the screen (ESC and other C0 and C1 codes,
//! DEL), or reorder what is shown (bidirectional overrides). Job names may
//! not contain them; logs escape them (see `crate::logging`).

/// Whether `c` is a control character: C0 (tab and newline included), DEL,
/// C1, the Unicode line and paragraph separators, or a bidirectional
/// embedding, override or isolate.
pub fn is_control(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Whether `text` holds any [`is_control`] character.
pub fn has_control(text: &str) -> bool {
    text.chars().any(is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_breaks_escapes_and_overrides_are_controls() {
        for c in [
            '\n', '\r', '\t', '\0', '\u{1b}', '\u{7f}', '\u{85}', '\u{9b}', '\u{2028}', '\u{2029}',
            '\u{202e}', '\u{2066}',
        ] {
            assert!(is_control(c), "{c:?}");
        }
        for c in ['a', ' ', 'é', '/', '*', '\u{200d}', '中'] {
            assert!(!is_control(c), "{c:?}");
        }
        assert!(has_control("a\nb"));
        assert!(!has_control("www-prod/send email"));
    }
}
