#![allow(clippy::unwrap_used)]

use serde_json::{json, Value};

use super::*;

/// A closed `pedido.creado`-like schema with `lineas` whose items are built by `line`.
fn order(extra: Value, line: Value) -> Value {
    let mut properties = json!({
        "id": {"type": "string"},
        "cliente": {"type": "string"},
        "lineas": {"type": "array", "items": {"$ref": "#/$defs/Linea"}},
    });
    if let (Some(map), Value::Object(extra)) = (properties.as_object_mut(), extra) {
        map.extend(extra);
    }
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "pedido.creado v2",
        "type": "object",
        "properties": properties,
        "required": ["id", "cliente", "lineas"],
        "additionalProperties": false,
        "$defs": {"Linea": line},
    })
}

fn line() -> Value {
    json!({
        "type": "object",
        "properties": {
            "producto": {"type": "string"},
            "cantidad": {"type": "integer", "format": "uint32", "minimum": 0},
            "precio_centimos": {"type": "integer", "format": "int64"},
        },
        "required": ["producto", "cantidad", "precio_centimos"],
        "additionalProperties": false,
    })
}

fn paths(violations: &[Violation]) -> Vec<String> {
    violations
        .iter()
        .flat_map(|v| v.problems.iter().map(|p| p.path.clone()))
        .collect()
}

fn backward(old: &Value, new: &Value) -> Vec<Violation> {
    check(Compatibility::Backward, std::slice::from_ref(old), new).unwrap()
}

#[test]
fn the_same_schema_is_compatible_every_way() {
    let schema = order(json!({}), line());
    for policy in Compatibility::ALL {
        assert!(
            check(policy, std::slice::from_ref(&schema), &schema)
                .unwrap()
                .is_empty(),
            "{policy}"
        );
    }
}

#[test]
fn adding_an_optional_field_to_a_closed_model_is_backward_but_not_forward() {
    let old = order(json!({}), line());
    let new = order(json!({"notas": {"type": ["string", "null"]}}), line());
    assert!(backward(&old, &new).is_empty());
    let forward = check(Compatibility::Forward, std::slice::from_ref(&old), &new).unwrap();
    assert_eq!(paths(&forward), ["notas"]);
    assert_eq!(forward[0].direction, Direction::Forward);
    assert!(!check(Compatibility::Full, &[old], &new).unwrap().is_empty());
}

#[test]
fn removing_a_required_field_breaks_backward_and_names_it() {
    let old = order(json!({}), line());
    let mut reduced = line();
    reduced["properties"]
        .as_object_mut()
        .unwrap()
        .remove("precio_centimos");
    reduced["required"] = json!(["producto", "cantidad"]);
    let new = order(json!({}), reduced);
    let violations = backward(&old, &new);
    assert_eq!(paths(&violations), ["lineas[].precio_centimos"]);
    assert_eq!(violations[0].revision, 1);
    assert!(violations[0]
        .to_string()
        .contains("lineas[].precio_centimos"));
}

#[test]
fn changing_a_type_breaks_backward() {
    let old = order(json!({}), line());
    let mut changed = line();
    changed["properties"]["cantidad"] = json!({"type": "string"});
    let violations = backward(&old, &order(json!({}), changed));
    assert_eq!(paths(&violations), ["lineas[].cantidad"]);
    assert!(violations[0].problems[0].rule.contains("type changed"));
}

#[test]
fn renaming_a_field_breaks_backward_at_both_names() {
    let old = order(json!({}), line());
    let mut renamed = old.clone();
    let props = renamed["properties"].as_object_mut().unwrap();
    let cliente = props.remove("cliente").unwrap();
    props.insert("cliente_id".into(), cliente);
    renamed["required"] = json!(["id", "cliente_id", "lineas"]);
    let mut found = paths(&backward(&old, &renamed));
    found.sort();
    assert_eq!(found, ["cliente", "cliente_id"]);
}

#[test]
fn tightening_an_enum_breaks_backward_and_widening_it_does_not() {
    let with = |values: Value| order(json!({"canal": {"type": "string", "enum": values}}), line());
    let two = with(json!(["web", "tienda"]));
    let one = with(json!(["web"]));
    let three = with(json!(["web", "tienda", "telefono"]));
    assert_eq!(paths(&backward(&two, &one)), ["canal"]);
    assert!(backward(&two, &three).is_empty());
    // An enum turned into any string: widening too.
    assert!(backward(&two, &order(json!({"canal": {"type": "string"}}), line())).is_empty());
    // Any string turned into an enum: tightening.
    let free = order(json!({"canal": {"type": "string"}}), line());
    assert_eq!(paths(&backward(&free, &two)), ["canal"]);
}

#[test]
fn making_an_optional_field_required_breaks_backward() {
    let optional = order(json!({"notas": {"type": "string"}}), line());
    let mut required = optional.clone();
    required["required"] = json!(["id", "cliente", "lineas", "notas"]);
    assert_eq!(paths(&backward(&optional, &required)), ["notas"]);
    // The other way round is fine.
    assert!(backward(&required, &optional).is_empty());
}

#[test]
fn integers_widen_to_numbers_but_not_back_and_ranges_may_only_grow() {
    let with = |schema: Value| order(json!({"peso": schema}), line());
    let int32 = with(json!({"type": "integer", "format": "int32"}));
    let int64 = with(json!({"type": "integer", "format": "int64"}));
    let number = with(json!({"type": "number"}));
    assert!(backward(&int32, &int64).is_empty());
    assert!(backward(&int32, &number).is_empty());
    assert_eq!(paths(&backward(&int64, &int32)), ["peso"]);
    assert_eq!(paths(&backward(&number, &int64)), ["peso"]);
    let positive = with(json!({"type": "integer", "exclusiveMinimum": 0}));
    let natural = with(json!({"type": "integer", "minimum": 0}));
    assert!(backward(&positive, &natural).is_empty());
    assert_eq!(paths(&backward(&natural, &positive)), ["peso"]);
}

#[test]
fn an_open_content_model_cannot_prove_an_added_property_safe() {
    let mut old = order(json!({}), line());
    old["additionalProperties"] = json!(true);
    let mut new = order(json!({"notas": {"type": "string"}}), line());
    new["additionalProperties"] = json!(true);
    assert_eq!(paths(&backward(&old, &new)), ["notas"]);
    // Closing an open model breaks backward too: earlier events may carry anything.
    let closed = order(json!({}), line());
    assert_eq!(paths(&backward(&old, &closed)), [".*"]);
}

#[test]
fn nullable_fields_through_any_of_and_type_arrays() {
    let nullable = order(
        json!({"direccion": {"anyOf": [{"$ref": "#/$defs/Linea"}, {"type": "null"}]}}),
        line(),
    );
    let not_null = order(json!({"direccion": {"$ref": "#/$defs/Linea"}}), line());
    // A reader that now takes null too reads every earlier event.
    assert!(backward(&not_null, &nullable).is_empty());
    // Earlier events may carry null, which the new reader refuses.
    assert_eq!(paths(&backward(&nullable, &not_null)), ["direccion"]);
    let with = |types: Value| order(json!({"notas": {"type": types}}), line());
    assert!(backward(&with(json!("string")), &with(json!(["string", "null"]))).is_empty());
    assert_eq!(
        paths(&backward(
            &with(json!(["string", "null"])),
            &with(json!("string"))
        )),
        ["notas"]
    );
}

#[test]
fn transitive_policies_check_every_earlier_revision() {
    let first = order(
        json!({"canal": {"type": "string", "enum": ["web"]}}),
        line(),
    );
    // Registered under NONE: every value allowed from then on.
    let second = order(json!({"canal": {"type": "integer"}}), line());
    let third = order(json!({"canal": {"type": "number"}}), line());
    let history = [first, second];
    assert!(check(Compatibility::Backward, &history, &third)
        .unwrap()
        .is_empty());
    let transitive = check(Compatibility::BackwardTransitive, &history, &third).unwrap();
    assert_eq!(transitive.len(), 1);
    assert_eq!(transitive[0].revision, 1);
    assert_eq!(paths(&transitive), ["canal"]);
    assert!(check(Compatibility::None, &history, &third)
        .unwrap()
        .is_empty());
}

#[test]
fn unsupported_keywords_and_broken_refs_are_errors_not_passes() {
    let old = order(json!({}), line());
    let mut odd = order(json!({}), line());
    odd["patternProperties"] = json!({"^x": {"type": "string"}});
    let error = check(Compatibility::Backward, std::slice::from_ref(&old), &odd).unwrap_err();
    assert!(error.reason.contains("patternProperties"), "{error}");
    let mut broken = old.clone();
    broken["properties"]["lineas"]["items"] = json!({"$ref": "#/$defs/Nada"});
    let error = check(Compatibility::Backward, &[old], &broken).unwrap_err();
    assert_eq!(error.path, "lineas[]");
}

#[test]
fn policies_parse_by_their_registry_names() {
    for policy in Compatibility::ALL {
        assert_eq!(policy.as_str().parse::<Compatibility>().unwrap(), policy);
    }
    assert_eq!(
        "backward_transitive".parse::<Compatibility>().unwrap(),
        Compatibility::BackwardTransitive
    );
    assert!("SIDEWAYS".parse::<Compatibility>().is_err());
    assert_eq!(Compatibility::default(), Compatibility::BackwardTransitive);
}
