//! Exact NDJSON framing.
//!
//! A frame is one line: the bytes of one canonical JSON object followed by
//! exactly one `\n`. The rules, identical in the TypeScript SDK:
//! - a frame, including its `\n`, is at most [`MAX_FRAME_BYTES`];
//! - `\r` is never accepted (no `\r\n` line ends);
//! - bytes left without a final `\n` at end of stream are an error;
//! - every error ends the connection: after one, [`FrameDecoder`] yields
//!   the same error again and never another frame.

use crate::error::{CARRIAGE_RETURN, EMBEDDED_NEWLINE, SafeError, TOO_LARGE, UNTERMINATED};

/// The largest frame, including its newline: 1 MiB.
pub const MAX_FRAME_BYTES: usize = 1_048_576;

/// Checks that `frame` is exactly one complete frame (content plus one
/// `\n`) and returns its content.
pub fn frame_content(frame: &[u8]) -> Result<&[u8], SafeError> {
    if frame.len() > MAX_FRAME_BYTES {
        return Err(TOO_LARGE);
    }
    let Some((&b'\n', content)) = frame.split_last() else {
        return Err(UNTERMINATED);
    };
    if content.contains(&b'\n') {
        return Err(EMBEDDED_NEWLINE);
    }
    if content.contains(&b'\r') {
        return Err(CARRIAGE_RETURN);
    }
    Ok(content)
}

/// Finds the end of the next frame in `buf`. `scanned` is how many bytes of
/// `buf` are already known to hold no `\n`; it is updated so repeated calls
/// on a growing buffer scan each byte once. Returns the frame length
/// (including `\n`) or `None` when more bytes are needed.
fn find_frame(buf: &[u8], scanned: &mut usize) -> Result<Option<usize>, SafeError> {
    let limit = buf.len().min(MAX_FRAME_BYTES);
    let start = (*scanned).min(limit);
    match buf[start..limit].iter().position(|&b| b == b'\n') {
        Some(pos) => {
            *scanned = 0;
            Ok(Some(start + pos + 1))
        }
        None if buf.len() >= MAX_FRAME_BYTES => Err(TOO_LARGE),
        None => {
            *scanned = limit;
            Ok(None)
        }
    }
}

/// An incremental frame splitter for a byte stream (sync use; see
/// [`FrameCodec`](crate::FrameCodec) for tokio).
#[derive(Debug, Default)]
pub struct FrameDecoder {
    buf: Vec<u8>,
    scanned: usize,
    failed: Option<SafeError>,
}

impl FrameDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes read from the stream.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            self.buf.extend_from_slice(bytes);
        }
    }

    /// The next complete frame (content plus `\n`), `Ok(None)` when more
    /// bytes are needed, or the error that ends the connection.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, SafeError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        match find_frame(&self.buf, &mut self.scanned) {
            Ok(Some(len)) => {
                let rest = self.buf.split_off(len);
                let frame = std::mem::replace(&mut self.buf, rest);
                if frame.contains(&b'\r') {
                    return Err(self.fail(CARRIAGE_RETURN));
                }
                Ok(Some(frame))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Called at end of stream: bytes left without a final `\n` are an
    /// error.
    pub fn finish(&mut self) -> Result<(), SafeError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(self.fail(UNTERMINATED))
        }
    }

    fn fail(&mut self, e: SafeError) -> SafeError {
        self.failed = Some(e);
        self.buf = Vec::new();
        e
    }
}

#[cfg(feature = "tokio")]
mod codec {
    use bytes::BytesMut;

    use super::{CARRIAGE_RETURN, UNTERMINATED, find_frame};
    use crate::error::SafeError;

    /// An error of [`FrameCodec`]: the transport failed, or the peer broke
    /// the framing rules. Either ends the connection.
    #[derive(Debug)]
    pub enum CodecError {
        /// The underlying reader failed.
        Io(std::io::Error),
        /// A framing rule was broken.
        Frame(SafeError),
    }

    impl From<std::io::Error> for CodecError {
        fn from(e: std::io::Error) -> Self {
            Self::Io(e)
        }
    }

    impl std::fmt::Display for CodecError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            match self {
                Self::Io(_) => f.write_str("transport error"),
                Self::Frame(e) => e.fmt(f),
            }
        }
    }

    impl std::error::Error for CodecError {}

    /// The framing rules as a `tokio_util::codec::Decoder`. Each item is one
    /// frame including its `\n`, ready for `decode_*_frame`.
    #[derive(Debug, Default)]
    pub struct FrameCodec {
        scanned: usize,
        failed: Option<SafeError>,
    }

    impl FrameCodec {
        /// A new codec.
        pub fn new() -> Self {
            Self::default()
        }

        fn fail(&mut self, buf: &mut BytesMut, e: SafeError) -> CodecError {
            self.failed = Some(e);
            buf.clear();
            CodecError::Frame(e)
        }
    }

    impl tokio_util::codec::Decoder for FrameCodec {
        type Item = BytesMut;
        type Error = CodecError;

        fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<BytesMut>, CodecError> {
            if let Some(e) = self.failed {
                return Err(CodecError::Frame(e));
            }
            match find_frame(buf, &mut self.scanned) {
                Ok(Some(len)) => {
                    let frame = buf.split_to(len);
                    if frame.contains(&b'\r') {
                        return Err(self.fail(buf, CARRIAGE_RETURN));
                    }
                    Ok(Some(frame))
                }
                Ok(None) => Ok(None),
                Err(e) => Err(self.fail(buf, e)),
            }
        }

        fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<BytesMut>, CodecError> {
            match self.decode(buf)? {
                Some(frame) => Ok(Some(frame)),
                None if buf.is_empty() => Ok(None),
                None => Err(self.fail(buf, UNTERMINATED)),
            }
        }
    }
}

#[cfg(feature = "tokio")]
pub use codec::{CodecError, FrameCodec};
