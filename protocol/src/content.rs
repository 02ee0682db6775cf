//! Reading referenced content: a digest-bound `ContentReference` is read in
//! parts of at most 512 KiB (`view.content` on the client channel,
//! `content.read` on the runner channel) and assembled here.
//!
//! Invariants:
//! - Every part must echo the reference and the offset it was asked for,
//!   be canonical base64 of at most the requested length, and make
//!   progress; the last part says `final` exactly at the referenced length.
//! - The assembled bytes are returned only when their length is the
//!   reference's `bytes` and their SHA-256 is the reference's digest (and
//!   every digest a part names).
//! - A reader states the largest value it accepts; a reference above it is
//!   refused before anything is read.
//! - Every failure is one [`ContentFailure`] with a closed code and a static
//!   message, never a panic and never text taken from the content.
//!
//! The server, the scripted runner and the Rust client all read content
//! through this one assembler.

use base64::Engine as _;
use serde_json::Value;
use sha2::Digest as _;

/// The largest part one read asks for.
pub const PART_BYTES: u64 = 512 * 1024;

/// The media type of canonical JSON content.
pub const JSON: &str = "application/json";

/// Why referenced content could not be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFailure {
    /// The server refused a part (missing content, a bad range, …).
    Unavailable,
    /// The reference is larger than this reader accepts.
    TooLarge,
    /// The reference names another media type than the reader expects.
    WrongMediaType,
    /// A part answered another reference or another offset.
    WrongPart,
    /// A part is not canonical base64, or longer than asked.
    BadPart,
    /// The parts end before or after the referenced length.
    WrongLength,
    /// The assembled bytes do not match the digest.
    DigestMismatch,
    /// The bytes are not canonical JSON (or nest too deep).
    NotJson,
}

impl ContentFailure {
    /// The closed wire error code.
    pub const fn code(self) -> &'static str {
        match self {
            Self::Unavailable => "contentUnavailable",
            Self::TooLarge => "frameTooLarge",
            Self::WrongMediaType | Self::NotJson => "schemaInvalid",
            Self::WrongPart | Self::BadPart | Self::WrongLength | Self::DigestMismatch => {
                "digestMismatch"
            }
        }
    }

    /// A static, bounded message that says what failed.
    pub const fn message(self) -> &'static str {
        match self {
            Self::Unavailable => "the server has no such content for this reader",
            Self::TooLarge => "the referenced content is larger than this reader accepts",
            Self::WrongMediaType => "the referenced content has an unexpected media type",
            Self::WrongPart => "a content part answered another reference or offset",
            Self::BadPart => "a content part is not canonical base64 of at most the asked length",
            Self::WrongLength => "the content parts do not add up to the referenced length",
            Self::DigestMismatch => "the assembled content does not match its digest",
            Self::NotJson => "the referenced content is not canonical JSON",
        }
    }
}

impl std::fmt::Display for ContentFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code(), self.message())
    }
}

impl std::error::Error for ContentFailure {}

/// The part to ask for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartRequest {
    pub offset: u64,
    pub length: u64,
}

/// One part as the server sent it.
#[derive(Clone, Copy, Debug)]
pub struct Part<'a> {
    /// The reference the part answers.
    pub reference: &'a Value,
    pub offset: u64,
    /// Base64 of the part's bytes.
    pub data: &'a str,
    pub last: bool,
    /// The digest of the whole content the server names (client channel).
    pub digest: Option<&'a str>,
}

/// Assembles one referenced value part by part.
#[derive(Debug)]
pub struct Assembler {
    reference: Value,
    digest: String,
    bytes: u64,
    assembled: Vec<u8>,
    named_digests: Vec<String>,
    done: bool,
}

impl Assembler {
    /// Starts reading `reference`, refusing it when it is malformed, of
    /// another media type than `media_type` (when given), or larger than
    /// `max_bytes`.
    pub fn new(
        reference: &Value,
        media_type: Option<&str>,
        max_bytes: u64,
    ) -> Result<Self, ContentFailure> {
        let digest = reference.get("digest").and_then(Value::as_str);
        let bytes = reference.get("bytes").and_then(Value::as_u64);
        let (Some(digest), Some(bytes)) = (digest, bytes) else {
            return Err(ContentFailure::WrongPart);
        };
        if let Some(expected) = media_type
            && reference.get("mediaType").and_then(Value::as_str) != Some(expected)
        {
            return Err(ContentFailure::WrongMediaType);
        }
        if bytes > max_bytes {
            return Err(ContentFailure::TooLarge);
        }
        Ok(Self {
            reference: reference.clone(),
            digest: digest.to_owned(),
            bytes,
            // A claimed length is not trusted with memory up front.
            assembled: Vec::with_capacity(usize::try_from(bytes.min(PART_BYTES * 8)).unwrap_or(0)),
            named_digests: Vec::new(),
            done: bytes == 0,
        })
    }

    /// The next part to ask for, or `None` when every byte arrived.
    pub fn next_request(&self) -> Option<PartRequest> {
        if self.done {
            return None;
        }
        let offset = self.assembled.len() as u64;
        Some(PartRequest {
            offset,
            length: PART_BYTES.min(self.bytes - offset),
        })
    }

    /// Accepts the part answering [`Self::next_request`].
    pub fn accept(&mut self, part: Part<'_>) -> Result<(), ContentFailure> {
        let Some(request) = self.next_request() else {
            return Err(ContentFailure::WrongLength);
        };
        if *part.reference != self.reference || part.offset != request.offset {
            return Err(ContentFailure::WrongPart);
        }
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(part.data)
            .map_err(|_| ContentFailure::BadPart)?;
        if base64::engine::general_purpose::STANDARD.encode(&decoded) != part.data
            || decoded.len() as u64 > request.length
        {
            return Err(ContentFailure::BadPart);
        }
        if let Some(digest) = part.digest {
            self.named_digests.push(digest.to_owned());
        }
        self.assembled.extend_from_slice(&decoded);
        let at = self.assembled.len() as u64;
        if part.last != (at == self.bytes) || decoded.is_empty() {
            return Err(ContentFailure::WrongLength);
        }
        self.done = part.last;
        Ok(())
    }

    /// The verified bytes.
    pub fn finish(self) -> Result<Vec<u8>, ContentFailure> {
        if !self.done || self.assembled.len() as u64 != self.bytes {
            return Err(ContentFailure::WrongLength);
        }
        let actual = digest_text(&self.assembled);
        if actual != self.digest || self.named_digests.iter().any(|named| *named != actual) {
            return Err(ContentFailure::DigestMismatch);
        }
        Ok(self.assembled)
    }
}

/// Decodes verified bytes as canonical JSON within the nesting limit.
pub fn json(bytes: &[u8]) -> Result<Value, ContentFailure> {
    crate::parse_canonical(bytes).map_err(|_| ContentFailure::NotJson)
}

/// The `sha256:<hex>` digest of `bytes`, as a `ContentReference` names it.
pub fn digest_text(bytes: &[u8]) -> String {
    let digest = sha2::Sha256::digest(bytes);
    let mut text = String::with_capacity(7 + 64);
    text.push_str("sha256:");
    for byte in digest {
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    text
}

const HEX: &[u8; 16] = b"0123456789abcdef";

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reference_of(bytes: &[u8], media_type: &str) -> Value {
        json!({
            "digest": digest_text(bytes),
            "mediaType": media_type,
            "bytes": bytes.len(),
        })
    }

    fn encode(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    /// Reads `content` through an honest server, part by part.
    fn read_all(reference: &Value, content: &[u8]) -> Result<Vec<u8>, ContentFailure> {
        let mut assembler = Assembler::new(reference, Some(JSON), 64 << 20)?;
        while let Some(request) = assembler.next_request() {
            let start = request.offset as usize;
            let end = (start + request.length as usize).min(content.len());
            let data = encode(&content[start..end]);
            assembler.accept(Part {
                reference,
                offset: request.offset,
                data: &data,
                last: end == content.len(),
                digest: None,
            })?;
        }
        assembler.finish()
    }

    fn big_json() -> Vec<u8> {
        crate::canonicalize(&json!({ "pad": "z".repeat(1_300_000) })).unwrap()
    }

    #[test]
    fn content_over_several_parts_is_assembled_and_verified() {
        let content = big_json();
        let reference = reference_of(&content, JSON);
        let bytes = read_all(&reference, &content).unwrap();
        assert_eq!(bytes, content);
        assert_eq!(
            json(&bytes).unwrap()["pad"].as_str().unwrap().len(),
            1_300_000
        );
        let assembler = Assembler::new(&reference, Some(JSON), 64 << 20).unwrap();
        assert_eq!(
            assembler.next_request(),
            Some(PartRequest {
                offset: 0,
                length: PART_BYTES
            })
        );
        assert!(
            content.len() as u64 > 2 * PART_BYTES,
            "three parts at least"
        );
    }

    #[test]
    fn a_wrong_digest_is_refused() {
        let content = big_json();
        let mut reference = reference_of(&content, JSON);
        reference["digest"] = json!(digest_text(b"other"));
        assert_eq!(
            read_all(&reference, &content),
            Err(ContentFailure::DigestMismatch)
        );
        // Same length, one byte changed.
        let reference = reference_of(&content, JSON);
        let mut tampered = content.clone();
        tampered[700_000] = b'q';
        assert_eq!(
            read_all(&reference, &tampered),
            Err(ContentFailure::DigestMismatch)
        );
    }

    #[test]
    fn a_wrong_length_is_refused() {
        let content = big_json();
        // The server's content is shorter than the reference says.
        let reference = reference_of(&content, JSON);
        assert_eq!(
            read_all(&reference, &content[..content.len() - 10]),
            Err(ContentFailure::WrongLength)
        );
        // A part that does not say final at the end, or says it too early.
        let small = br#"{"a":1}"#;
        let reference = reference_of(small, JSON);
        let mut assembler = Assembler::new(&reference, Some(JSON), 1 << 20).unwrap();
        let data = encode(small);
        let part = |last| Part {
            reference: &reference,
            offset: 0,
            data: &data,
            last,
            digest: None,
        };
        assert_eq!(
            assembler.accept(part(false)),
            Err(ContentFailure::WrongLength)
        );
        let mut assembler = Assembler::new(&reference, Some(JSON), 1 << 20).unwrap();
        let half = encode(&small[..3]);
        assert_eq!(
            assembler.accept(Part {
                reference: &reference,
                offset: 0,
                data: &half,
                last: true,
                digest: None
            }),
            Err(ContentFailure::WrongLength)
        );
        // An empty part before the end makes no progress.
        let mut assembler = Assembler::new(&reference, Some(JSON), 1 << 20).unwrap();
        assert_eq!(
            assembler.accept(Part {
                reference: &reference,
                offset: 0,
                data: "",
                last: false,
                digest: None
            }),
            Err(ContentFailure::WrongLength)
        );
    }

    #[test]
    fn a_part_for_another_range_or_reference_or_too_long_is_refused() {
        let content = big_json();
        let reference = reference_of(&content, JSON);
        let data = encode(&content[..1024]);
        let mut assembler = Assembler::new(&reference, Some(JSON), 64 << 20).unwrap();
        assert_eq!(
            assembler.accept(Part {
                reference: &reference,
                offset: 1,
                data: &data,
                last: false,
                digest: None
            }),
            Err(ContentFailure::WrongPart)
        );
        let other = reference_of(b"{}", JSON);
        assert_eq!(
            assembler.accept(Part {
                reference: &other,
                offset: 0,
                data: &data,
                last: false,
                digest: None
            }),
            Err(ContentFailure::WrongPart)
        );
        let too_long = encode(&content[..(PART_BYTES as usize + 1)]);
        assert_eq!(
            assembler.accept(Part {
                reference: &reference,
                offset: 0,
                data: &too_long,
                last: false,
                digest: None
            }),
            Err(ContentFailure::BadPart)
        );
        for bad in ["not base64!", "eyJhIjoxfQ", "eyJhIjoxfR=="] {
            let mut assembler = Assembler::new(&reference, Some(JSON), 64 << 20).unwrap();
            assert_eq!(
                assembler.accept(Part {
                    reference: &reference,
                    offset: 0,
                    data: bad,
                    last: false,
                    digest: None
                }),
                Err(ContentFailure::BadPart),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_digest_a_part_names_must_match_too() {
        let small = br#"{"a":1}"#;
        let reference = reference_of(small, JSON);
        let mut assembler = Assembler::new(&reference, None, 1 << 20).unwrap();
        let data = encode(small);
        let wrong = digest_text(b"x");
        assembler
            .accept(Part {
                reference: &reference,
                offset: 0,
                data: &data,
                last: true,
                digest: Some(&wrong),
            })
            .unwrap();
        assert_eq!(assembler.finish(), Err(ContentFailure::DigestMismatch));
    }

    #[test]
    fn a_wrong_media_type_a_malformed_reference_and_an_oversized_one_are_refused_before_reading() {
        let content = br#"{"a":1}"#;
        assert_eq!(
            Assembler::new(&reference_of(content, "text/plain"), Some(JSON), 1 << 20).err(),
            Some(ContentFailure::WrongMediaType)
        );
        assert_eq!(
            Assembler::new(&json!({ "digest": 1 }), Some(JSON), 1 << 20).err(),
            Some(ContentFailure::WrongPart)
        );
        let mut huge = reference_of(content, JSON);
        huge["bytes"] = json!(1u64 << 40);
        assert_eq!(
            Assembler::new(&huge, Some(JSON), 256 << 20).err(),
            Some(ContentFailure::TooLarge)
        );
    }

    #[test]
    fn verified_bytes_that_are_not_canonical_json_are_refused() {
        for bytes in [&b"not json"[..], b"{ \"a\": 1 }", b"{\"b\":1,\"a\":2}"] {
            let reference = reference_of(bytes, JSON);
            let verified = read_all(&reference, bytes).unwrap();
            assert_eq!(json(&verified), Err(ContentFailure::NotJson));
        }
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        assert_eq!(json(deep.as_bytes()), Err(ContentFailure::NotJson));
        assert_eq!(json(b"{\"a\":1}").unwrap(), json!({ "a": 1 }));
    }

    #[test]
    fn the_digest_is_sha256_in_its_text_form() {
        assert_eq!(
            digest_text(b"abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn every_failure_has_a_closed_code_and_a_bounded_message() {
        for failure in [
            ContentFailure::Unavailable,
            ContentFailure::TooLarge,
            ContentFailure::WrongMediaType,
            ContentFailure::WrongPart,
            ContentFailure::BadPart,
            ContentFailure::WrongLength,
            ContentFailure::DigestMismatch,
            ContentFailure::NotJson,
        ] {
            let code: crate::ErrorCode = failure.code().parse().unwrap();
            assert_eq!(code.to_string(), failure.code());
            assert!(!failure.message().is_empty() && failure.message().len() <= 512);
        }
    }
}
