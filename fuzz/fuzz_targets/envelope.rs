//! Bytes as they arrive from a broker: the envelope parser, the `traceparent` header and the
//! stored header lists must turn anything into a value or an error, never a panic.

#![no_main]

use entrega_core::{Envelope, Headers, Limits, TraceContext, DEFAULT_MAX_DEPTH};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    envelope(data);
    if let Ok(text) = std::str::from_utf8(data) {
        traceparent(text);
        headers(text);
    }
});

fn envelope(data: &[u8]) {
    let limits = Limits::default();
    let Ok(parsed) = Envelope::parse_with(data, &limits) else {
        return;
    };
    // The depth limit exists so a hostile message cannot exhaust the stack; an accepted one
    // must really be within it (the outer object is the first level).
    assert!(
        1 + depth(&parsed.data) <= limits.max_depth,
        "accepted an envelope nested deeper than {}",
        limits.max_depth
    );
    // What a producer writes must read back: every service parses its own events. Only the
    // size limit is lifted, since re-serializing may lengthen numbers (`1E2` → `100.0`).
    let written = parsed.to_bytes();
    let again = Envelope::parse_with(
        &written,
        &Limits {
            max_bytes: usize::MAX,
            max_depth: DEFAULT_MAX_DEPTH,
        },
    )
    .unwrap_or_else(|e| panic!("an envelope's own bytes do not parse: {e}"));
    // `datos` is compared by its shape only: without serde_json's `float_roundtrip`, a float
    // may come back one unit in the last place off.
    let shape = |e: &Envelope| {
        let data = depth(&e.data);
        (
            Envelope {
                data: Value::Null,
                ..e.clone()
            },
            data,
        )
    };
    assert_eq!(shape(&again), shape(&parsed));
}

fn traceparent(text: &str) {
    let Ok(context) = TraceContext::parse(text) else {
        return;
    };
    assert_eq!(context.trace_id().len(), 32);
    assert_eq!(context.span_id().len(), 16);
    // The header written for the next hop carries the same context.
    assert_eq!(TraceContext::parse(&context.header()), Ok(context));
}

fn headers(text: &str) {
    if let Ok(list) = Headers::from_json(text) {
        assert_eq!(Headers::from_json(&list.to_json()).ok(), Some(list));
    }
    let object = Headers::from_json_object(text);
    let written = object.to_json_object();
    assert_eq!(written.is_none(), object.is_empty());
    if let Some(written) = written {
        assert_eq!(Headers::from_json_object(&written), object);
    }
}

/// Levels of arrays and objects in `value` (a scalar is 0).
fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}
