//! A SafeError never contains frame contents.

use protocol::{SafeError, decode_client_frame, decode_launch, decode_runner_frame};
use serde_json::json;

const SECRET: &str = "SECRET-MARKER-7f3a";

fn frames() -> Vec<Vec<u8>> {
    let payload = json!({"workflow":SECRET,"input":{SECRET:SECRET},"executionMode":SECRET,"projectPath":"/p"});
    let good = json!({"schema":"pi-workflows.client.v1","type":"request","requestId":"r1","clientId":"c1",
                      "operation":"run.start","payload":payload});
    let canonical = |v: &serde_json::Value| {
        let mut b = protocol::canonicalize(v).unwrap();
        b.push(b'\n');
        b
    };
    let mut unknown = good.clone();
    unknown[SECRET] = json!(SECRET);
    let mut bad_type = good.clone();
    bad_type["type"] = json!(SECRET);
    let body = canonical(&good);
    vec![
        canonical(&good),                           // schema: bad enum value
        canonical(&unknown),                        // schema: unknown field
        canonical(&bad_type),                       // schema: unknown tag
        [&body[..body.len() - 1], b" \n"].concat(), // not canonical
        [b"{\"".as_slice(), SECRET.as_bytes(), b"\":1,\"a\":\n"].concat(), // not JSON
        [SECRET.as_bytes(), b"\r\n"].concat(),      // framing
        [b"[".repeat(70).as_slice(), SECRET.as_bytes(), b"\n"].concat(), // too deep
    ]
}

fn assert_clean(e: SafeError) {
    let rendered = format!("{e} {e:?} {} {:?}", e.message(), e.to_wire());
    assert!(
        !rendered.contains(SECRET),
        "error leaks frame contents: {rendered}"
    );
    assert!(e.message().chars().count() <= 512);
}

#[test]
fn errors_never_echo_payload_contents() {
    for f in frames() {
        assert_clean(decode_client_frame(&f).unwrap_err());
        assert_clean(decode_runner_frame(&f).unwrap_err());
        assert_clean(decode_launch(&f).unwrap_err());
    }
}
