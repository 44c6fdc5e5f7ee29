//! The body of `POST /pedidos` as the handler reads it (`OrderBody` in
//! km0/src/services/pedidos/http.rs): at most `MAX_BODY_BYTES`, parsed as JSON, then validated
//! by `NewOrder::from_json`. Any body must give an order or an error naming a field, never a
//! panic; an accepted order must keep the rules its validation promises.

#![no_main]

use km0::services::pedidos::{
    order_created_in_saga, NewOrder, OrderSaga, MAX_BODY_BYTES, MAX_LINES, MAX_TEXT_LEN,
};
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // A longer body is refused before it is parsed.
    if data.len() > MAX_BODY_BYTES {
        return;
    }
    let Ok(body) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let order = match NewOrder::from_json(&body) {
        Ok(order) => order,
        Err(e) => {
            // The 400 answer names the field at fault (`campo`).
            assert!(!e.field.is_empty(), "an error without a field: {e:?}");
            return;
        }
    };
    accepted(&order);
});

fn accepted(order: &NewOrder) {
    for text in [&order.id, &order.customer, &order.market] {
        text_rule(text);
    }
    if let Some(card) = &order.card {
        text_rule(card);
    }
    if let Some(address) = &order.address {
        text_rule(&address.city);
        text_rule(&address.street);
    }
    assert!((1..=MAX_LINES).contains(&order.lines.len()));
    for line in &order.lines {
        text_rule(&line.product);
        assert!(line.quantity >= 1 && line.price_cents >= 0, "{line:?}");
    }
    assert!(order.amount_cents() >= 0);
    assert!(order.units() >= 1);
    // `pedido.creado` carries the order as received, and what consumes it reads it back the
    // same way.
    assert_eq!(
        NewOrder::from_json(&order.to_payload()).as_ref(),
        Ok(order),
        "the event's payload does not read back as the order"
    );
    let _ = order_created_in_saga(order);
    // With the order saga on, the handler also builds the saga's input, which needs an
    // address and nothing else.
    assert_eq!(OrderSaga::input(order).is_ok(), order.address.is_some());
}

fn text_rule(text: &str) {
    assert!(
        !text.trim().is_empty() && text.chars().count() <= MAX_TEXT_LEN,
        "{text:?}"
    );
}
