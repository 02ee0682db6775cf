//! Canonical JSON and the canonical-on-the-wire rule.

use protocol::{ErrorCode, MAX_DEPTH, canonicalize, is_canonical, parse_canonical};
use serde_json::Value;

#[test]
fn the_wire_rule_accepts_only_exact_canonical_text() {
    let cases: [(&str, bool); 14] = [
        (r#"{"a":1,"b":"x"}"#, true),
        (r#"{"a":"é"}"#, true),
        (r#"{"a":1e+21}"#, true),
        (r#"{"b":"x","a":1}"#, false),
        (r#"{"a":1,"a":2}"#, false),
        (r#"{"a":1.0}"#, false),
        (r#"{"a":9007199254740993}"#, false),
        (r#"{"a":-0}"#, false),
        (r#"{"a":"\u0041"}"#, false),
        (r#"{"a": 1}"#, false),
        (r#"{"a":1e2}"#, false),
        (r#"{"a":"\ud800"}"#, false),
        ("\u{feff}{}", false),
        (r#"{"a":"\/"}"#, false),
    ];
    for (text, want) in cases {
        assert_eq!(is_canonical(text.as_bytes()), want, "{text}");
    }
}

#[test]
fn canonicalize_sorts_by_utf16_code_units() {
    // U+1F600 (surrogates D83D..) sorts before U+FB33 in UTF-16 order,
    // although it is the larger code point.
    let v: Value = serde_json::from_str(r#"{"דּ":1,"😀":2,"a":3}"#).unwrap();
    assert_eq!(
        String::from_utf8(canonicalize(&v).unwrap()).unwrap(),
        r#"{"a":3,"😀":2,"דּ":1}"#
    );
}

#[test]
fn nesting_limit_is_64() {
    let nested = |n: usize| format!("{}0{}", "[".repeat(n), "]".repeat(n));
    assert!(parse_canonical(nested(MAX_DEPTH).as_bytes()).is_ok());
    assert_eq!(
        parse_canonical(nested(MAX_DEPTH + 1).as_bytes())
            .unwrap_err()
            .code(),
        ErrorCode::NestingTooDeep
    );
    // Brackets inside strings do not count.
    let in_string = format!("[\"{}\"]", "[".repeat(200));
    assert!(parse_canonical(in_string.as_bytes()).is_ok());
    let escaped_quote = format!("[\"\\\"{}\"]", "[".repeat(200));
    assert!(parse_canonical(escaped_quote.as_bytes()).is_ok());
}

#[test]
fn serde_json_has_no_arbitrary_precision() {
    // With `arbitrary_precision`, serde_json keeps number text verbatim and
    // this would print "1e2", silently weakening the wire rule.
    let v: Value = serde_json::from_str("1e2").unwrap();
    assert_eq!(v.to_string(), "100.0");
}
