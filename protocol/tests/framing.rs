//! The NDJSON framing rules, sync and through tokio.

use futures_util::StreamExt as _;
use protocol::{ErrorCode, FrameCodec, FrameDecoder, MAX_FRAME_BYTES, frame_content};
use tokio_util::codec::FramedRead;

/// A frame of exactly `len` bytes including its newline.
fn frame_of(len: usize) -> Vec<u8> {
    let mut f = vec![b'x'; len - 1];
    f.push(b'\n');
    f
}

/// Feeds `input` in chunks of `chunk` bytes; returns the frames and the
/// first error (after which the decoder must yield nothing more).
fn split(input: &[u8], chunk: usize) -> (Vec<Vec<u8>>, Option<ErrorCode>) {
    let mut d = FrameDecoder::new();
    let mut frames = Vec::new();
    for part in input.chunks(chunk.max(1)) {
        d.push(part);
        loop {
            match d.next_frame() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return (frames, Some(e.code())),
            }
        }
    }
    match d.finish() {
        Ok(()) => (frames, None),
        Err(e) => (frames, Some(e.code())),
    }
}

#[test]
fn splits_frames_across_any_chunking() {
    let input = b"{\"a\":1}\n{\"b\":2}\n[]\n";
    for chunk in [1, 2, 3, 7, 64] {
        let (frames, err) = split(input, chunk);
        assert_eq!(err, None, "chunk {chunk}");
        assert_eq!(
            frames,
            vec![
                b"{\"a\":1}\n".to_vec(),
                b"{\"b\":2}\n".to_vec(),
                b"[]\n".to_vec()
            ]
        );
    }
}

#[test]
fn frame_limit_counts_the_newline() {
    let (frames, err) = split(&frame_of(MAX_FRAME_BYTES), 65_536);
    assert_eq!((frames.len(), err), (1, None));
    let (frames, err) = split(&frame_of(MAX_FRAME_BYTES + 1), 65_536);
    assert_eq!((frames.len(), err), (0, Some(ErrorCode::FrameTooLarge)));
    assert!(frame_content(&frame_of(MAX_FRAME_BYTES)).is_ok());
    assert_eq!(
        frame_content(&frame_of(MAX_FRAME_BYTES + 1))
            .unwrap_err()
            .code(),
        ErrorCode::FrameTooLarge
    );
}

#[test]
fn an_over_limit_line_fails_before_its_newline_arrives() {
    let mut d = FrameDecoder::new();
    d.push(&vec![b'x'; MAX_FRAME_BYTES]);
    assert_eq!(d.next_frame().unwrap_err().code(), ErrorCode::FrameTooLarge);
}

#[test]
fn errors_end_the_connection() {
    let mut d = FrameDecoder::new();
    d.push(b"{}\r\n{\"a\":1}\n");
    assert_eq!(
        d.next_frame().unwrap_err().code(),
        ErrorCode::MalformedFrame
    );
    // A later valid frame is never delivered.
    d.push(b"{\"b\":2}\n");
    assert!(d.next_frame().is_err());
    assert!(d.finish().is_err());
}

#[test]
fn carriage_returns_and_missing_newlines_are_malformed() {
    assert_eq!(split(b"{}\r\n", 4).1, Some(ErrorCode::MalformedFrame));
    assert_eq!(
        split(b"{\"a\":\"\r\"}\n", 4).1,
        Some(ErrorCode::MalformedFrame)
    );
    let (frames, err) = split(b"{}\n{}", 2);
    assert_eq!((frames.len(), err), (1, Some(ErrorCode::MalformedFrame)));
    assert_eq!(
        frame_content(b"{}").unwrap_err().code(),
        ErrorCode::MalformedFrame
    );
    assert_eq!(
        frame_content(b"{}\n{}\n").unwrap_err().code(),
        ErrorCode::MalformedFrame
    );
    assert_eq!(split(b"", 1), (vec![], None));
}

async fn tokio_split(input: &'static [u8]) -> (Vec<Vec<u8>>, Option<ErrorCode>) {
    let mut stream = FramedRead::with_capacity(input, FrameCodec::new(), 3);
    let mut frames = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(f) => frames.push(f.to_vec()),
            Err(protocol::CodecError::Frame(e)) => return (frames, Some(e.code())),
            Err(protocol::CodecError::Io(e)) => panic!("io error {e}"),
        }
    }
    (frames, None)
}

#[tokio::test]
async fn tokio_codec_has_the_same_rules() {
    let (frames, err) = tokio_split(b"{\"a\":1}\n{\"b\":2}\n").await;
    assert_eq!((frames.len(), err), (2, None));
    // LinesCodec would strip the \r and deliver the unterminated tail; ours
    // rejects both.
    assert_eq!(
        tokio_split(b"{}\r\n").await.1,
        Some(ErrorCode::MalformedFrame)
    );
    let (frames, err) = tokio_split(b"{}\n{\"tail\":1}").await;
    assert_eq!((frames.len(), err), (1, Some(ErrorCode::MalformedFrame)));
    let big: &'static [u8] = Box::leak(frame_of(MAX_FRAME_BYTES + 1).into_boxed_slice());
    assert_eq!(tokio_split(big).await.1, Some(ErrorCode::FrameTooLarge));
    let exact: &'static [u8] = Box::leak(frame_of(MAX_FRAME_BYTES).into_boxed_slice());
    assert_eq!(tokio_split(exact).await, (vec![exact.to_vec()], None));
}
