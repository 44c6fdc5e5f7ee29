//! The envelope parser: the seed wire form, and typed errors naming the offending field.
#![allow(clippy::unwrap_used, clippy::panic)]

use entrega_core::{Envelope, EnvelopeError, Limits};
use serde_json::json;

fn valid() -> serde_json::Value {
    json!({"id_evento": "6f1c9e2a-1d2b-4c3d-8e4f-5a6b7c8d9e0f", "tipo": "pedido.creado",
           "version": 1, "fecha_ms": 1789000000000i64, "origen": "pedidos",
           "datos": {"id": "P-1"}})
}

fn parse(v: &serde_json::Value) -> Result<Envelope, EnvelopeError> {
    Envelope::parse(&serde_json::to_vec(v).unwrap())
}

#[test]
fn round_trips_the_seed_wire_form() {
    let env = parse(&valid()).unwrap();
    assert_eq!(env.kind, "pedido.creado");
    assert_eq!(env.data["id"], "P-1");
    let back: serde_json::Value = serde_json::from_slice(&env.to_bytes()).unwrap();
    assert_eq!(back, valid());
}

#[test]
fn ignores_unknown_fields() {
    let mut v = valid();
    v["extra"] = json!({"a": 1});
    assert!(parse(&v).is_ok());
}

#[test]
fn names_the_missing_field() {
    for name in [
        "id_evento",
        "tipo",
        "version",
        "fecha_ms",
        "origen",
        "datos",
    ] {
        let mut v = valid();
        v.as_object_mut().unwrap().remove(name);
        let err = parse(&v).unwrap_err();
        assert_eq!(err.field(), Some(name), "{err}");
    }
}

#[test]
fn rejects_bad_values_naming_the_field() {
    let cases = [
        ("id_evento", json!("not-a-uuid")),
        ("id_evento", json!(42)),
        ("tipo", json!("")),
        ("tipo", json!("   ")),
        ("version", json!(0)),
        ("version", json!(-1)),
        ("version", json!("1")),
        ("fecha_ms", json!("yesterday")),
        ("origen", json!(7)),
    ];
    for (name, value) in cases {
        let mut v = valid();
        v[name] = value.clone();
        match parse(&v) {
            Err(EnvelopeError::InvalidField { field, .. }) => assert_eq!(field, name),
            other => panic!("{name}={value}: {other:?}"),
        }
    }
}

#[test]
fn rejects_malformed_json_with_position() {
    let err = Envelope::parse(b"{\"id_evento\": ").unwrap_err();
    assert!(
        matches!(err, EnvelopeError::Malformed { line: 1, .. }),
        "{err}"
    );
    assert_eq!(
        Envelope::parse(b"[1,2]").unwrap_err(),
        EnvelopeError::NotAnObject
    );
    assert!(matches!(
        Envelope::parse(&[0xff, 0xfe]).unwrap_err(),
        EnvelopeError::Malformed { .. }
    ));
}

#[test]
fn enforces_size_limit() {
    let mut v = valid();
    v["datos"] = json!({"blob": "x".repeat(2000)});
    let bytes = serde_json::to_vec(&v).unwrap();
    let limits = Limits {
        max_bytes: 1000,
        ..Limits::default()
    };
    assert!(matches!(
        Envelope::parse_with(&bytes, &limits),
        Err(EnvelopeError::TooLarge { limit: 1000, .. })
    ));
}

#[test]
fn enforces_depth_limit_without_recursing() {
    let deep = format!(
        "{{\"datos\":{}{}}}",
        "[".repeat(100_000),
        "]".repeat(100_000)
    );
    assert_eq!(
        Envelope::parse(deep.as_bytes()).unwrap_err(),
        EnvelopeError::TooDeep {
            limit: entrega_core::DEFAULT_MAX_DEPTH
        }
    );
    // Brackets inside strings do not count.
    let mut v = valid();
    v["datos"] = json!({"texto": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["});
    assert!(parse(&v).is_ok());
}
