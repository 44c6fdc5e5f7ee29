//! entrega's own headers renamed to English: a message an earlier release wrote is still
//! understood (read under the former name), and removing a header removes both names.

use entrega_core::headers::{former, CLASS, CODE, ONLY_GROUP, REPLAYS};
use entrega_core::Headers;

#[test]
fn renamed_headers_are_read_under_their_former_names_and_removed_with_them() {
    let mut earlier = Headers::new()
        .with(former::REENVIOS, "2")
        .with(former::CLASE, "rechazado");
    assert_eq!(earlier.get_current(REPLAYS), Some("2"));
    assert_eq!(earlier.get_current(CLASS), Some("rechazado"));
    assert_eq!(earlier.get_current(CODE), None);
    // The current name wins when both are there.
    earlier.set(REPLAYS, "3");
    assert_eq!(earlier.get_current(REPLAYS), Some("3"));
    earlier.remove_current(REPLAYS);
    assert_eq!(earlier.get_current(REPLAYS), None);
    assert_eq!(earlier.get(former::REENVIOS), None);
    assert_eq!(earlier.get_current(CLASS), Some("rechazado"));
}

#[test]
fn every_renamed_header_has_an_english_name_and_a_distinct_former_one() {
    for (now, then) in former::RENAMED {
        assert!(now.starts_with("entrega-") && then.starts_with("entrega-"));
        assert_ne!(now, then);
        assert_eq!(former::before(now), Some(then));
    }
    assert_eq!(former::before(ONLY_GROUP), Some(former::SOLO_GRUPO));
    assert_eq!(
        former::before("tipo"),
        None,
        "the seed's headers are not renamed"
    );
}
