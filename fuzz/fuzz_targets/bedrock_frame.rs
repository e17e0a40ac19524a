//! Fuzzes the Bedrock port's request parser: `frame::parse` (the whole of
//! what a client has sent so far) and `frame::FrameReader` (the incremental
//! reader each connection keeps over its growing buffer).
//!
//! Properties (the same as `bedrock::fuzz` in tests/integration, which also
//! runs them in CI on mutations of this corpus):
//! - nothing panics;
//! - a request uses at least one byte (so a connection always makes progress)
//!   and at most the input, and at most `MAX_REQUEST` bytes, blank lines
//!   before it included;
//! - the first `consumed` bytes alone give the same request;
//! - bytes fed in two chunks (read the first; only if that needs more, read
//!   the whole) give the same result as the whole at once, both afresh with
//!   `parse` and on with one `FrameReader`;
//! - more bytes are asked for only while at most `MAX_REQUEST` are buffered;
//! - a pipelined stream read by one reader as a connection reads it (pieces
//!   of sizes the input picks, answered bytes dropped from the front) gives
//!   the same requests and the same final error as read whole;
//! - once anything but blank space has arrived, the reader says a request
//!   is in progress (so the request time limit, not the idle one, runs).
//!
//! Run (from fuzz/; new inputs go to the first directory, the seeds in
//! corpus/ stay as they are):
//! `cargo +nightly fuzz run bedrock_frame /tmp/bedrock_frame_corpus corpus/bedrock_frame -- -runs=3000000 -max_len=1024`
//! (`RUSTC_BOOTSTRAP=1 cargo +stable fuzz run ...` works too.)

#![no_main]

use jobmgr::server::bedrock::frame::{FrameError, FrameReader, MAX_REQUEST, Request, parse};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| check(data));

type Stream = (Vec<Request>, Option<FrameError>);

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
        let afresh = match parse(&data[..k]) {
            Ok(None) => parse(data),
            decided => decided,
        };
        assert_eq!(afresh, whole, "parse, split at {k}");
        let mut reader = FrameReader::default();
        let on = match reader.next(&data[..k]) {
            Ok(None) => reader.next(data),
            decided => decided,
        };
        assert_eq!(on, whole, "one reader, split at {k}");
    }

    // A connection: pieces of 1..=13 bytes as the input's bytes pick, and
    // byte by byte.
    let expected = stream(data);
    let picked = |at: usize| {
        if data.is_empty() {
            1
        } else {
            (data[at % data.len()] as usize % 13) + 1
        }
    };
    assert_eq!(connection(data, picked), expected, "read in picked pieces");
    assert_eq!(connection(data, |_| 1), expected, "read byte by byte");
}

/// The stream read with `parse` from the whole input.
fn stream(data: &[u8]) -> Stream {
    let mut requests = Vec::new();
    let mut rest = data;
    loop {
        match parse(rest) {
            Err(error) => return (requests, Some(error)),
            Ok(None) => return (requests, None),
            Ok(Some((request, used))) => {
                requests.push(request);
                rest = &rest[used..];
            }
        }
    }
}

/// The stream read as a connection reads it.
fn connection(data: &[u8], piece: impl Fn(usize) -> usize) -> Stream {
    let mut reader = FrameReader::default();
    let mut requests = Vec::new();
    let (mut pos, mut received) = (0, 0);
    loop {
        match reader.next(&data[pos..received]) {
            Err(error) => return (requests, Some(error)),
            Ok(Some((request, used))) => {
                assert!(used > 0, "a request must use at least one byte");
                assert!(pos + used <= received, "used more than has arrived");
                assert!(!reader.in_request(), "the reader starts afresh");
                requests.push(request);
                pos += used;
            }
            Ok(None) => {
                let pending = &data[pos..received];
                assert!(pending.len() <= MAX_REQUEST);
                if pending.iter().any(|b| !b.is_ascii_whitespace()) {
                    assert!(reader.in_request(), "a request has begun");
                }
                if received == data.len() {
                    return (requests, None);
                }
                received = (received + piece(received).max(1)).min(data.len());
            }
        }
    }
}
