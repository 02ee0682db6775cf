//! Helpers shared by the fuzz targets.

use protocol::FrameDecoder;
use serde_json::Value;

/// Splits `data` as a byte stream with `FrameDecoder` (in two pushes, split
/// at a point the first byte chooses, so partial reads are covered) and
/// calls `each` with every complete frame. Checks the decoder's own rules:
/// every frame it yields passes `frame_content`, and after an error it
/// yields only that error again.
///
/// `each` first gets the whole input as one frame, exactly as a single read
/// would hand it to a `decode_*_frame` (which checks the framing itself).
pub fn for_each_frame(data: &[u8], mut each: impl FnMut(&[u8])) {
    each(data);
    let split = data
        .first()
        .map_or(0, |&b| usize::from(b) % (data.len() + 1));
    let mut decoder = FrameDecoder::new();
    decoder.push(&data[..split]);
    let mut pushed_rest = false;
    loop {
        match decoder.next_frame() {
            Ok(Some(frame)) => {
                assert!(
                    protocol::frame_content(&frame).is_ok(),
                    "the stream decoder yields only well-framed frames"
                );
                each(&frame);
            }
            Ok(None) if !pushed_rest => {
                decoder.push(&data[split..]);
                pushed_rest = true;
            }
            Ok(None) => {
                if let Err(e) = decoder.finish() {
                    assert_eq!(decoder.next_frame(), Err(e), "an error ends the stream");
                }
                return;
            }
            Err(e) => {
                assert_eq!(decoder.next_frame(), Err(e), "an error ends the stream");
                assert_eq!(decoder.finish(), Err(e), "an error ends the stream");
                return;
            }
        }
    }
}

/// The nesting depth of arrays and objects in `value` (a scalar is 0, the
/// top-level object is 1), as `MAX_DEPTH` counts it.
pub fn value_depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(value_depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(value_depth).max().unwrap_or(0),
        _ => 0,
    }
}
