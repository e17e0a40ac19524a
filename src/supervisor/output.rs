//! A worker's output, kept within a byte cap: the first half of the cap
//! from the start, the second half from the end, and a count of what was
//! dropped between them. Nothing is dropped silently: a truncated capture
//! says so.

use std::collections::VecDeque;

/// Collects one stream.
#[derive(Debug, Clone)]
pub struct Capture {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    total: u64,
}

/// A finished capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The text kept, with a marker where bytes were dropped.
    pub text: String,
    /// How many bytes the stream carried in all.
    pub total: u64,
    /// Whether bytes were dropped.
    pub truncated: bool,
    /// The last non-empty line, when it was kept whole and is UTF-8.
    pub last_line: Option<String>,
}

impl Capture {
    /// A capture keeping at most `cap` bytes.
    pub fn new(cap: usize) -> Self {
        let head_cap = cap / 2;
        Capture {
            head_cap,
            tail_cap: cap - head_cap,
            head: Vec::new(),
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Adds bytes read from the stream.
    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len() as u64;
        if self.head.len() < self.head_cap {
            let take = bytes.len().min(self.head_cap - self.head.len());
            self.head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
        }
        if bytes.len() >= self.tail_cap {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - self.tail_cap..]);
            return;
        }
        let overflow = (self.tail.len() + bytes.len()).saturating_sub(self.tail_cap);
        self.tail.drain(..overflow);
        self.tail.extend(bytes);
    }

    /// The capture so far.
    pub fn finish(&self) -> Captured {
        let kept = self.head.len() as u64 + self.tail.len() as u64;
        let dropped = self.total - kept;
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        let mut text = String::from_utf8_lossy(&self.head).into_owned();
        if dropped > 0 {
            let bytes = if dropped == 1 { "byte" } else { "bytes" };
            text.push_str(&format!("\n[… {dropped} {bytes} of output dropped …]\n"));
        }
        text.push_str(&String::from_utf8_lossy(&tail));

        // The last line counts only if it was kept whole: with bytes dropped,
        // it must lie within the tail after a newline.
        let whole: Vec<u8> = if dropped == 0 {
            [self.head.as_slice(), &tail].concat()
        } else {
            tail
        };
        let trimmed = whole.strip_suffix(b"\n").unwrap_or(&whole);
        let last_line = match trimmed.iter().rposition(|&b| b == b'\n') {
            Some(at) => Some(&trimmed[at + 1..]),
            None if dropped == 0 => Some(trimmed),
            None => None,
        }
        .filter(|line| !line.iter().all(u8::is_ascii_whitespace))
        // Bytes that are not UTF-8 are not JSON: such a line is not data,
        // rather than data with replacement characters in it.
        .and_then(|line| std::str::from_utf8(line).ok())
        .map(|line| line.trim_end_matches('\r').to_string());
        Captured {
            text,
            total: self.total,
            truncated: dropped > 0,
            last_line,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_output_is_kept_whole() {
        let mut capture = Capture::new(100);
        capture.push(b"hello\n");
        capture.push(b"{\"a\":1}\n");
        let done = capture.finish();
        assert_eq!(done.text, "hello\n{\"a\":1}\n");
        assert!(!done.truncated);
        assert_eq!(done.last_line.as_deref(), Some("{\"a\":1}"));
    }

    #[test]
    fn big_output_keeps_head_and_tail_and_says_so() {
        let mut capture = Capture::new(20);
        for _ in 0..1000 {
            capture.push(b"0123456789");
        }
        capture.push(b"\nLAST\n");
        let done = capture.finish();
        assert!(done.truncated);
        assert_eq!(done.total, 10_006);
        assert!(done.text.starts_with("0123456789"));
        assert!(done.text.contains("bytes of output dropped"));
        assert!(done.text.ends_with("\nLAST\n"));
        assert_eq!(done.last_line.as_deref(), Some("LAST"));
    }

    #[test]
    fn a_last_line_that_is_not_utf8_is_not_used() {
        let mut capture = Capture::new(100);
        capture.push(b"text\n{\"a\":\"\xff\xfe\"}\n");
        let done = capture.finish();
        assert_eq!(done.last_line, None);
        assert!(done.text.contains("text"), "{:?}", done.text);
    }

    #[test]
    fn a_last_line_cut_by_the_cap_is_not_used() {
        let mut capture = Capture::new(10);
        capture.push(&[b'x'; 100]);
        assert_eq!(capture.finish().last_line, None);
    }
}
