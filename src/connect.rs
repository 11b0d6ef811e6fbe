//! The Connect protocol's shared part (JSON codec, as envd speaks it; protocol doc §4.1): the
//! envelope framing and the table of error codes, their HTTP statuses and what they mean to a
//! provider. The client (`provider::e2b::connect`: the stream decoder, error bodies) and
//! `serve` (`server::connect`: axum responses) are built on this one file, so the two sides
//! cannot drift apart on a flag bit or a status.
//!
//! An envelope is one flag byte, a 4-byte big-endian length and that many bytes of JSON.

use crate::error::ErrorKind;

/// Flag bit: the payload is compressed (we always ask for identity, so this is an error).
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit: this is the end-of-stream trailer.
pub const FLAG_END_STREAM: u8 = 0x02;

/// One envelope around `msg`.
pub fn envelope(flags: u8, msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + msg.len());
    out.push(flags);
    out.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    out.extend_from_slice(msg);
    out
}

/// Connect codes and their HTTP statuses (the Connect HTTP mapping). Where several codes
/// share a status, the first is what a bare status is read as.
const CODES: &[(&str, u16)] = &[
    ("canceled", 499),
    ("invalid_argument", 400),
    ("failed_precondition", 400),
    ("out_of_range", 400),
    ("deadline_exceeded", 504),
    ("not_found", 404),
    ("already_exists", 409),
    ("aborted", 409),
    ("permission_denied", 403),
    ("resource_exhausted", 429),
    ("unimplemented", 501),
    ("unavailable", 503),
    ("unauthenticated", 401),
];

/// The HTTP status of a unary error with this code (500 for `internal`, `unknown` and the rest).
pub fn http_status(code: &str) -> u16 {
    CODES.iter().find(|(c, _)| *c == code).map_or(500, |(_, s)| *s)
}

/// The code a plain HTTP status stands for, when an error body carries no Connect code
/// (proxies, `/files`, integer `code`s).
pub fn code_for_status(status: u16) -> &'static str {
    match status {
        // A gateway in front of envd: the sandbox is not reachable now.
        502 => "unavailable",
        _ => CODES.iter().find(|(_, s)| *s == status).map_or("unknown", |(c, _)| c),
    }
}

/// What a provider makes of a code.
pub fn error_kind(code: &str) -> ErrorKind {
    match code {
        "not_found" => ErrorKind::NotFound,
        "invalid_argument" | "already_exists" | "failed_precondition" | "out_of_range" => ErrorKind::Invalid,
        "unauthenticated" | "permission_denied" => ErrorKind::Auth,
        "deadline_exceeded" | "canceled" => ErrorKind::Timeout,
        "unimplemented" => ErrorKind::Unsupported,
        "resource_exhausted" => ErrorKind::Capacity,
        _ => ErrorKind::Infra,
    }
}

/// The code `serve` answers a provider error with.
pub fn code_of(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::NotFound => "not_found",
        ErrorKind::Invalid => "invalid_argument",
        ErrorKind::Timeout => "deadline_exceeded",
        ErrorKind::Auth => "unauthenticated",
        ErrorKind::Unsupported => "unimplemented",
        ErrorKind::Infra => "internal",
        ErrorKind::Capacity => "resource_exhausted",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statuses_go_both_ways() {
        assert_eq!(envelope(FLAG_END_STREAM, b"{}"), vec![2, 0, 0, 0, 2, b'{', b'}']);
        for (code, status) in CODES {
            assert_eq!(http_status(code), *status);
            // A bare status is read as a code with that status.
            assert_eq!(http_status(code_for_status(*status)), *status, "{code}");
        }
        assert_eq!(http_status("internal"), 500);
        assert_eq!(code_for_status(500), "unknown");
        assert_eq!(code_for_status(502), "unavailable");
        assert_eq!(code_for_status(418), "unknown");
        // What serve sends for a provider error is read back as the same kind.
        for kind in [
            ErrorKind::NotFound,
            ErrorKind::Invalid,
            ErrorKind::Timeout,
            ErrorKind::Auth,
            ErrorKind::Unsupported,
            ErrorKind::Infra,
            ErrorKind::Capacity,
        ] {
            assert_eq!(error_kind(code_of(kind)), kind);
        }
    }
}
