//! The Connect protocol, JSON codec, as envd speaks it (protocol doc §4.1): envelope framing
//! for streaming calls, the end-of-stream trailer, and Connect error codes.
//!
//! The framing and the code table are shared with `serve` (`crate::connect`). Hand-written on
//! purpose. An envelope is one flag byte, a 4-byte big-endian length and
//! that many bytes of JSON; the whole codec is this file. The Connect crates for Rust
//! (`connectrpc`, `connect-rpc`, tonic-based stacks) are built around prost-generated
//! protobuf types and a code-generation step, which would pull protobuf tooling and envd's
//! `.proto` files into the build just to speak JSON that serde already handles — and the
//! JSON details envd needs (int64 as strings, enum names, omitted zeroes) would still need
//! our own handling.
//!
//! [`Decoder`] is fed bytes as they arrive (any split, including mid-header) and yields
//! whole frames; [`Decoder::finish`] tells a clean end from a stream cut inside a frame.

use serde::Deserialize;
use serde_json::Value as JsonValue;

use crate::provider::ErrorKind;

pub use crate::connect::{envelope, FLAG_COMPRESSED, FLAG_END_STREAM};

/// Refuse frames larger than this: a corrupt length must not make us allocate gigabytes.
pub const MAX_FRAME: usize = 64 << 20;

/// A Connect error: a code such as `not_found` and a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectError {
    pub code: String,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into() }
    }

    /// What the runner should make of it.
    pub fn kind(&self) -> ErrorKind {
        crate::connect::error_kind(&self.code)
    }
}

/// Reads an error out of a non-200 response body: a Connect error (`"code"` a string), or
/// anything else (integer `code`, not JSON) mapped from the HTTP status.
pub fn error_from_body(status: u16, body: &[u8]) -> ConnectError {
    let parsed: Option<JsonValue> = serde_json::from_slice(body).ok();
    let message = parsed
        .as_ref()
        .and_then(|j| j.get("message"))
        .and_then(JsonValue::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| snippet(body));
    match parsed.as_ref().and_then(|j| j.get("code")).and_then(JsonValue::as_str) {
        Some(code) => ConnectError::new(code, message),
        None => ConnectError::new(crate::connect::code_for_status(status), message),
    }
}

/// The start of a body, for messages.
pub fn snippet(body: &[u8]) -> String {
    let s = String::from_utf8_lossy(body);
    let s = s.trim();
    if s.chars().count() > 200 {
        format!("{}…", s.chars().take(200).collect::<String>())
    } else {
        s.to_string()
    }
}

/// The end-of-stream trailer's JSON: `{}` or `{"error":{…},"metadata":{…}}`.
#[derive(Debug, Default, Deserialize)]
struct EndStreamJson {
    #[serde(default)]
    error: Option<ErrorJson>,
}

#[derive(Debug, Deserialize)]
struct ErrorJson {
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// A frame of a server stream.
#[derive(Debug, PartialEq)]
pub enum Frame {
    /// A message's JSON bytes.
    Message(Vec<u8>),
    /// The end-of-stream trailer: `None` on success.
    End(Option<ConnectError>),
}

/// Why a stream could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Compressed,
    TooLarge(usize),
    BadTrailer(String),
    /// The stream stopped inside a frame (`have` of `want` bytes of it arrived).
    Truncated {
        have: usize,
        want: usize,
    },
    /// Bytes after the end-of-stream trailer.
    AfterEnd,
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Compressed => f.write_str("compressed envelope received although identity was requested"),
            DecodeError::TooLarge(n) => write!(f, "envelope of {n} bytes exceeds the {MAX_FRAME}-byte limit"),
            DecodeError::BadTrailer(e) => write!(f, "malformed end-of-stream message: {e}"),
            DecodeError::Truncated { have, want } => {
                write!(f, "stream cut in the middle of a frame ({have} of {want} bytes)")
            }
            DecodeError::AfterEnd => f.write_str("data after the end-of-stream message"),
        }
    }
}

/// Incremental envelope decoder.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    ended: bool,
}

impl Decoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends bytes as they arrived.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame, if the buffer holds one.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, DecodeError> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        if self.ended {
            return Err(DecodeError::AfterEnd);
        }
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let flags = self.buf[0];
        let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
        if flags & FLAG_COMPRESSED != 0 {
            return Err(DecodeError::Compressed);
        }
        if len > MAX_FRAME {
            return Err(DecodeError::TooLarge(len));
        }
        if self.buf.len() < 5 + len {
            return Ok(None);
        }
        let payload: Vec<u8> = self.buf[5..5 + len].to_vec();
        self.buf.drain(..5 + len);
        if flags & FLAG_END_STREAM != 0 {
            self.ended = true;
            return Ok(Some(Frame::End(parse_trailer(&payload)?)));
        }
        Ok(Some(Frame::Message(payload)))
    }

    /// Call when the body ended: an error if bytes of an unfinished frame are left over.
    pub fn finish(&self) -> Result<(), DecodeError> {
        if self.buf.is_empty() {
            return Ok(());
        }
        if self.ended {
            return Err(DecodeError::AfterEnd);
        }
        let want = if self.buf.len() >= 5 {
            5 + u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize
        } else {
            5
        };
        Err(DecodeError::Truncated { have: self.buf.len(), want })
    }
}

fn parse_trailer(payload: &[u8]) -> Result<Option<ConnectError>, DecodeError> {
    if payload.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let t: EndStreamJson = serde_json::from_slice(payload).map_err(|e| DecodeError::BadTrailer(e.to_string()))?;
    Ok(t.error.map(|e| ConnectError::new(e.code.unwrap_or_else(|| "unknown".into()), e.message.unwrap_or_default())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_frames(d: &mut Decoder) -> Vec<Frame> {
        let mut out = Vec::new();
        while let Some(f) = d.next_frame().unwrap() {
            out.push(f);
        }
        out
    }

    #[test]
    fn envelope_layout() {
        let e = envelope(0, b"{\"a\":1}");
        assert_eq!(&e[..5], &[0, 0, 0, 0, 7]);
        assert_eq!(&e[5..], b"{\"a\":1}");
        assert_eq!(envelope(FLAG_END_STREAM, b"{}"), vec![2, 0, 0, 0, 2, b'{', b'}']);
    }

    #[test]
    fn decodes_messages_and_trailer_fed_byte_by_byte() {
        let mut wire = envelope(0, br#"{"event":{"start":{"pid":7}}}"#);
        wire.extend(envelope(0, b"{}"));
        wire.extend(envelope(FLAG_END_STREAM, b"{}"));
        let mut d = Decoder::new();
        let mut frames = Vec::new();
        for b in &wire {
            d.push(std::slice::from_ref(b));
            frames.extend(all_frames(&mut d));
        }
        assert_eq!(
            frames,
            vec![
                Frame::Message(br#"{"event":{"start":{"pid":7}}}"#.to_vec()),
                Frame::Message(b"{}".to_vec()),
                Frame::End(None)
            ]
        );
        assert_eq!(d.finish(), Ok(()));
    }

    #[test]
    fn empty_message_frame() {
        let mut d = Decoder::new();
        d.push(&envelope(0, b""));
        assert_eq!(d.next_frame().unwrap(), Some(Frame::Message(Vec::new())));
    }

    #[test]
    fn trailer_with_error() {
        let mut d = Decoder::new();
        d.push(&envelope(
            FLAG_END_STREAM,
            br#"{"error":{"code":"invalid_argument","message":"cwd '/nope' does not exist"},"metadata":{"x":["y"]}}"#,
        ));
        let f = d.next_frame().unwrap().unwrap();
        let Frame::End(Some(e)) = f else { panic!("{f:?}") };
        assert_eq!(e.code, "invalid_argument");
        assert_eq!(e.message, "cwd '/nope' does not exist");
        assert_eq!(e.kind(), ErrorKind::Invalid);
    }

    #[test]
    fn trailer_error_without_code_is_unknown() {
        let mut d = Decoder::new();
        d.push(&envelope(FLAG_END_STREAM, br#"{"error":{"message":"boom"}}"#));
        assert_eq!(d.next_frame().unwrap(), Some(Frame::End(Some(ConnectError::new("unknown", "boom")))));
    }

    #[test]
    fn stream_cut_mid_frame() {
        let wire = envelope(0, br#"{"event":{"data":{"stdout":"aGkK"}}}"#);
        let mut d = Decoder::new();
        d.push(&wire[..wire.len() - 3]);
        assert_eq!(d.next_frame().unwrap(), None);
        assert_eq!(d.finish(), Err(DecodeError::Truncated { have: wire.len() - 3, want: wire.len() }));
        // Cut inside the 5-byte header.
        let mut d = Decoder::new();
        d.push(&wire[..3]);
        assert_eq!(d.next_frame().unwrap(), None);
        assert_eq!(d.finish(), Err(DecodeError::Truncated { have: 3, want: 5 }));
        assert!(d.finish().unwrap_err().to_string().contains("cut in the middle"));
    }

    #[test]
    fn refuses_compressed_oversized_and_trailing_data() {
        let mut d = Decoder::new();
        d.push(&envelope(FLAG_COMPRESSED, b"xx"));
        assert_eq!(d.next_frame(), Err(DecodeError::Compressed));

        let mut d = Decoder::new();
        d.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        assert!(matches!(d.next_frame(), Err(DecodeError::TooLarge(_))));

        let mut d = Decoder::new();
        let mut wire = envelope(FLAG_END_STREAM, b"{}");
        wire.extend(envelope(0, b"{}"));
        d.push(&wire);
        assert_eq!(d.next_frame().unwrap(), Some(Frame::End(None)));
        assert_eq!(d.next_frame(), Err(DecodeError::AfterEnd));

        let mut d = Decoder::new();
        d.push(&envelope(FLAG_END_STREAM, b"not json"));
        assert!(matches!(d.next_frame(), Err(DecodeError::BadTrailer(_))));
    }

    #[test]
    fn error_bodies() {
        let e = error_from_body(404, br#"{"code":"not_found","message":"process with pid 9 not found"}"#);
        assert_eq!(e, ConnectError::new("not_found", "process with pid 9 not found"));
        // Proxy/plain errors carry integer codes: map from the HTTP status.
        let e = error_from_body(502, br#"{"sandboxId":"x","message":"The sandbox was not found","code":502}"#);
        assert_eq!(e, ConnectError::new("unavailable", "The sandbox was not found"));
        let e = error_from_body(401, b"<html>nope</html>");
        assert_eq!(e, ConnectError::new("unauthenticated", "<html>nope</html>"));
        assert_eq!(crate::connect::error_kind("deadline_exceeded"), ErrorKind::Timeout);
        assert_eq!(crate::connect::error_kind("unimplemented"), ErrorKind::Unsupported);
        assert_eq!(crate::connect::error_kind("internal"), ErrorKind::Infra);
        assert_eq!(crate::connect::error_kind("permission_denied"), ErrorKind::Auth);
    }
}
