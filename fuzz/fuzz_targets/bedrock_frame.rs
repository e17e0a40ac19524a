//! Fuzzes the Bedrock port's request parser, `frame::parse`, which is handed
//! whatever bytes a client has sent so far.
//!
//! Properties (the same as `bedrock::fuzz` in tests/integration, which also
//! runs them in CI on mutations of this corpus):
//! - it never panics;
//! - a request uses at least one byte (so a connection always makes progress)
//!   and at most the input, and at most `MAX_REQUEST` bytes, blank lines
//!   before it included;
//! - the first `consumed` bytes alone give the same request;
//! - bytes fed in two chunks (parse the first; only if that needs more,
//!   parse the whole) give the same result as the whole at once;
//! - it asks for more bytes only while fewer than `MAX_REQUEST` are buffered;
//! - a pipelined stream is read request by request to its end.
//!
//! Run (from fuzz/; new inputs go to the first directory, the seeds in
//! corpus/ stay as they are):
//! `cargo +nightly fuzz run bedrock_frame /tmp/bedrock_frame_corpus corpus/bedrock_frame -- -runs=5000000`

#![no_main]

use jobmgr::server::bedrock::frame::{MAX_REQUEST, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check(data));

fn check(data: &[u8]) {
    let whole = parse(data);
    match &whole {
        Ok(Some((request, used))) => {
            assert!(*used > 0, "a request must use at least one byte");
            assert!(*used <= data.len(), "used {used} of {} bytes", data.len());
            assert!(*used <= MAX_REQUEST, "a request of {used} bytes");
            assert!(request.body.len() <= *used);
            assert_eq!(parse(&data[..*used]), whole, "the used bytes alone");
        }
        Ok(None) => assert!(
            data.len() <= MAX_REQUEST,
            "asks for more with {} bytes buffered",
            data.len()
        ),
        Err(_) => {}
    }

    // Two chunks: the first k bytes, then the rest. The interesting places
    // to cut are next to line ends; the middle and the ends are cut too.
    // (The proptest in tests/ cuts its inputs at every byte.)
    let mut splits = vec![0, data.len() / 2, data.len()];
    for (i, _) in data
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'\n')
        .take(16)
    {
        splits.extend([i, i + 1]);
    }
    for k in splits {
        let result = match parse(&data[..k]) {
            Ok(None) => parse(data),
            decided => decided,
        };
        assert_eq!(result, whole, "split at {k}");
    }

    // A pipelined stream, read as a connection reads it.
    let mut rest = data;
    while let Ok(Some((_, used))) = parse(rest) {
        rest = &rest[used..];
    }
}
