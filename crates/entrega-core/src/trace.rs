//! W3C Trace Context (`traceparent`): the ids that make one order one trace, from the HTTP
//! request through the outbox, the broker and every consumer that acts on it.
//!
//! A context names a trace (16 bytes) and a span within it (8 bytes). Each hop that does work
//! of its own takes a [`TraceContext::child`]: same trace, new span, the previous span as its
//! parent. The header form is `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`
//! (<https://www.w3.org/TR/trace-context/#traceparent-header>).

use std::fmt;

use uuid::Uuid;

/// Header carrying the trace context on HTTP requests and on broker messages.
pub const TRACEPARENT: &str = "traceparent";

/// Why a `traceparent` value was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceparentError {
    /// Not four dash-separated fields of the right lengths.
    #[error("traceparent must be `version-traceid-parentid-flags`, got {0:?}")]
    Shape(String),
    /// A field holds something other than lowercase hex digits.
    #[error("traceparent fields must be lowercase hex, got {0:?}")]
    NotHex(String),
    /// Version `ff`, forbidden by the specification.
    #[error("traceparent version ff is invalid")]
    InvalidVersion,
    /// The trace id or the span id is all zeros.
    #[error("traceparent ids must not be all zeros")]
    ZeroId,
}

/// A position in a trace: which trace, which span, and whether it is sampled.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceContext {
    trace_id: [u8; 16],
    span_id: [u8; 8],
    flags: u8,
}

impl TraceContext {
    /// The start of a new trace, sampled.
    pub fn root() -> Self {
        let trace_id = *Uuid::new_v4().as_bytes();
        Self {
            trace_id,
            span_id: new_span_id(),
            flags: 1,
        }
    }

    /// A new span of the same trace whose parent is this one.
    pub fn child(&self) -> Self {
        Self {
            span_id: new_span_id(),
            ..*self
        }
    }

    /// Parses a `traceparent` header. Versions above `00` are read by their first four fields,
    /// as the specification asks, and written back as `00`.
    pub fn parse(header: &str) -> Result<Self, TraceparentError> {
        let header = header.trim();
        let shape = || TraceparentError::Shape(header.chars().take(64).collect());
        let mut fields = header.split('-');
        let (Some(version), Some(trace), Some(span), Some(flags)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(shape());
        };
        if version.len() != 2 || trace.len() != 32 || span.len() != 16 || flags.len() != 2 {
            return Err(shape());
        }
        // Byte lengths matched; only ASCII may be sliced by byte below.
        if !header.is_ascii() {
            return Err(TraceparentError::NotHex(header.chars().take(64).collect()));
        }
        let version = hex_byte(version, header)?;
        if version == 0xff {
            return Err(TraceparentError::InvalidVersion);
        }
        if version == 0 && fields.next().is_some() {
            return Err(shape());
        }
        let mut trace_id = [0u8; 16];
        let mut span_id = [0u8; 8];
        for (i, byte) in trace_id.iter_mut().enumerate() {
            *byte = hex_byte(&trace[2 * i..2 * i + 2], header)?;
        }
        for (i, byte) in span_id.iter_mut().enumerate() {
            *byte = hex_byte(&span[2 * i..2 * i + 2], header)?;
        }
        if trace_id == [0; 16] || span_id == [0; 8] {
            return Err(TraceparentError::ZeroId);
        }
        Ok(Self {
            trace_id,
            span_id,
            flags: hex_byte(flags, header)?,
        })
    }

    /// A context from its raw parts, e.g. the ids an OpenTelemetry SDK drew for a span;
    /// `None` when either id is all zeros (the specification's invalid ids).
    pub fn from_ids(trace_id: [u8; 16], span_id: [u8; 8], flags: u8) -> Option<Self> {
        (trace_id != [0; 16] && span_id != [0; 8]).then_some(Self {
            trace_id,
            span_id,
            flags,
        })
    }

    /// The trace id's 16 bytes.
    pub fn trace_id_bytes(&self) -> [u8; 16] {
        self.trace_id
    }

    /// The span id's 8 bytes.
    pub fn span_id_bytes(&self) -> [u8; 8] {
        self.span_id
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        hex(&self.trace_id)
    }

    /// The span id as 16 lowercase hex digits.
    pub fn span_id(&self) -> String {
        hex(&self.span_id)
    }

    /// Whether the caller asked for this trace to be recorded (flag `01`).
    pub fn sampled(&self) -> bool {
        self.flags & 1 == 1
    }

    /// The `traceparent` header value.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id(),
            self.span_id(),
            self.flags
        )
    }
}

impl fmt::Display for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.header())
    }
}

impl fmt::Debug for TraceContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceContext({})", self.header())
    }
}

fn new_span_id() -> [u8; 8] {
    let bytes = Uuid::new_v4().into_bytes();
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[8..]);
    // A v4 uuid's second half carries its variant bits, never all zeros.
    id
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

fn hex_byte(pair: &str, header: &str) -> Result<u8, TraceparentError> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes = pair.as_bytes();
    match (
        bytes.first().and_then(|c| digit(*c)),
        bytes.get(1).and_then(|c| digit(*c)),
    ) {
        (Some(hi), Some(lo)) if bytes.len() == 2 => Ok(hi << 4 | lo),
        _ => Err(TraceparentError::NotHex(header.chars().take(64).collect())),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const SPEC_EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_specification_example_round_trips() {
        let ctx = TraceContext::parse(SPEC_EXAMPLE).unwrap();
        assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(ctx.span_id(), "00f067aa0ba902b7");
        assert!(ctx.sampled());
        assert_eq!(ctx.header(), SPEC_EXAMPLE);
    }

    #[test]
    fn a_child_keeps_the_trace_and_takes_a_new_span() {
        let parent = TraceContext::parse(SPEC_EXAMPLE).unwrap();
        let child = parent.child();
        assert_eq!(child.trace_id(), parent.trace_id());
        assert_ne!(child.span_id(), parent.span_id());
        assert_eq!(TraceContext::parse(&child.header()).unwrap(), child);
        let unsampled = TraceContext::parse(&SPEC_EXAMPLE.replace("-01", "-00")).unwrap();
        assert!(!unsampled.child().sampled());
    }

    #[test]
    fn raw_ids_round_trip_and_zero_ids_are_refused() {
        let ctx = TraceContext::parse(SPEC_EXAMPLE).unwrap();
        let again = TraceContext::from_ids(ctx.trace_id_bytes(), ctx.span_id_bytes(), ctx.flags());
        assert_eq!(again, Some(ctx));
        assert_eq!(
            TraceContext::from_ids([0; 16], ctx.span_id_bytes(), 1),
            None
        );
        assert_eq!(
            TraceContext::from_ids(ctx.trace_id_bytes(), [0; 8], 1),
            None
        );
        let unsampled = TraceContext::from_ids([1; 16], [2; 8], 0).unwrap();
        assert!(unsampled.header().ends_with("-00"));
    }

    #[test]
    fn roots_are_new_traces() {
        let (a, b) = (TraceContext::root(), TraceContext::root());
        assert_ne!(a.trace_id(), b.trace_id());
        assert_eq!(TraceContext::parse(&a.header()).unwrap(), a);
    }

    #[test]
    fn bad_values_are_refused_with_their_reason() {
        let cases = [
            ("", "shape"),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
                "shape",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
                "shape",
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                "hex",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                "hex",
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                "version",
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                "zero",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                "zero",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
                "shape",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0é",
                "shape",
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
                "hex",
            ),
        ];
        for (value, why) in cases {
            let err = TraceContext::parse(value).unwrap_err();
            let matched = match why {
                "shape" => matches!(err, TraceparentError::Shape(_)),
                "hex" => matches!(err, TraceparentError::NotHex(_)),
                "version" => err == TraceparentError::InvalidVersion,
                _ => err == TraceparentError::ZeroId,
            };
            assert!(matched, "{value:?}: {err:?}");
        }
    }

    #[test]
    fn later_versions_are_read_by_their_first_fields() {
        let future = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next";
        let ctx = TraceContext::parse(future).unwrap();
        assert_eq!(ctx.header(), SPEC_EXAMPLE);
    }
}
