//! The binary protocol, version 1. Over TCP each frame is preceded by its
//! length as a little-endian `u32` (checked against `max_frame_bytes`
//! before anything is allocated); over WebSocket each binary message is one
//! frame. Integers are little-endian.
//!
//! ```text
//! frame    = version:u8 (=1) type:u8 corr:u64 fields
//! str8     = len:u8 bytes      str16 = len:u16 bytes
//!
//! requests                                  responses (same corr)
//!  1 Hello     token:str16                   101 HelloOk    version:u8
//!  2 Append    log:str8 client:u64 req:u64   102 Appended   pos:u64
//!              bytes (rest of frame)
//!  3 Read      log:str8 pos:u64              103 Entry      pos:u64 bytes (rest)
//!  4 Bounds    log:str8                      104 Bounds     first:u64 tail:u64
//!  5 Trim      log:str8 pos:u64              105 Done
//!  6 Subscribe log:str8 from:u64             103 Entry ... for every entry from `from` on
//!  7 Ping                                    107 Pong
//!  8 AppendBatch log:str8 client:u64         108 AppendedBatch count:u32 pos:u64 x count
//!              first_req:u64 count:u32
//!              (len:u32 bytes) x count
//!  9 ReadRange log:str8 from:u64             109 Entries    first:u64 count:u32
//!              max_records:u32 max_bytes:u32                (len:u32 bytes) x count
//! 10 SubscribeBatches log:str8 from:u64      109 Entries ... for every batch from `from` on
//!              max_records:u32 max_bytes:u32
//!                                            200 Error      code:u16 a:u64 b:u64 message:str16
//! ```
//!
//! `corr` is chosen by the client and echoed; responses may come out of
//! order. Error codes are [`Code`]; `a` and `b` carry the numbers of the
//! error (position and tail, position and first, length and limit).
//!
//! An `Entries` answer holds the records at positions `first`,
//! `first + 1`, ...: at most `max_records` of them ([`MAX_RANGE_RECORDS`]
//! at most) and `max_bytes` of record bytes ([`MAX_RANGE_BYTES`] at most),
//! but always at least one when `from` is below the tail, and never a
//! frame over the service's `max_frame_bytes`.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::StoreError;

/// Protocol version spoken by this build.
pub const VERSION: u8 = 1;

/// The most records one `Entries` answer holds; a `ReadRange` or
/// `SubscribeBatches` asking for more gets this many.
pub const MAX_RANGE_RECORDS: u32 = 4096;

/// The most record bytes one `Entries` answer holds (beyond its first
/// record, which is always sent whole); a request asking for more gets
/// this many.
pub const MAX_RANGE_BYTES: u32 = 4 << 20;

/// Bytes of an `Entries` frame besides its records: the header (version,
/// type, correlation id), `first` and the count.
pub const ENTRIES_HEADER_BYTES: usize = 1 + 1 + 8 + 8 + 4;

/// Bytes each record adds to an `Entries` frame besides its own: its
/// length.
pub const ENTRIES_RECORD_OVERHEAD: usize = 4;

/// The length of the `Entries` frame holding records of these lengths.
pub fn entries_frame_len(lens: impl IntoIterator<Item = usize>) -> usize {
    lens.into_iter()
        .map(|l| l + ENTRIES_RECORD_OVERHEAD)
        .sum::<usize>()
        + ENTRIES_HEADER_BYTES
}

/// Error codes of `Error` frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u16)]
pub enum Code {
    /// The frame did not parse.
    BadFrame = 1,
    /// Unknown protocol version.
    Version = 2,
    /// No or unknown token.
    Unauthorized = 3,
    /// The token lacks the right for this log or operation.
    Forbidden = 4,
    /// Position not written yet (a = pos, b = tail).
    NotYetWritten = 5,
    /// Position trimmed (a = pos, b = first).
    Trimmed = 6,
    /// Record or frame too large (a = length, b = limit).
    TooLarge = 7,
    /// Invalid log name.
    BadLogName = 8,
    /// Write failed; retry with the same request id.
    WriteFailed = 9,
    /// The log is full; trim it.
    Full = 10,
    /// Data lost beyond what parity covers.
    Unrecoverable = 11,
    /// The service is shutting down.
    ShuttingDown = 12,
    /// Connection limit reached.
    Busy = 13,
    /// Trim beyond the tail (a = pos, b = tail).
    TrimBeyondTail = 14,
    /// No space left on a disk of the log; free some or trim, then retry
    /// with the same request id.
    NoSpace = 15,
    /// A log's positions or the store's stripe numbers would reach 2^62;
    /// not retryable.
    Exhausted = 16,
}

impl Code {
    /// From the wire; unknown codes are `BadFrame`.
    pub fn from_u16(v: u16) -> Code {
        use Code::*;
        match v {
            2 => Version,
            3 => Unauthorized,
            4 => Forbidden,
            5 => NotYetWritten,
            6 => Trimmed,
            7 => TooLarge,
            8 => BadLogName,
            9 => WriteFailed,
            10 => Full,
            11 => Unrecoverable,
            12 => ShuttingDown,
            13 => Busy,
            14 => TrimBeyondTail,
            15 => NoSpace,
            16 => Exhausted,
            _ => BadFrame,
        }
    }
}

/// A request frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Authenticate.
    Hello {
        /// Bearer token.
        token: String,
    },
    /// Append a record.
    Append {
        /// Log name.
        log: String,
        /// Client id (0: not idempotent).
        client: u64,
        /// Request id, unique per client.
        request: u64,
        /// The record.
        bytes: Bytes,
    },
    /// Read one record.
    Read {
        /// Log.
        log: String,
        /// Position.
        pos: u64,
    },
    /// First and tail.
    Bounds {
        /// Log.
        log: String,
    },
    /// Trim below `pos`.
    Trim {
        /// Log.
        log: String,
        /// New first position.
        pos: u64,
    },
    /// Push every entry from `from` on.
    Subscribe {
        /// Log.
        log: String,
        /// First position wanted.
        from: u64,
    },
    /// Liveness.
    Ping,
    /// Append several records at consecutive positions; request ids are
    /// `first_request + i`.
    AppendBatch {
        /// Log name.
        log: String,
        /// Client id (0: not idempotent).
        client: u64,
        /// Request id of the first record.
        first_request: u64,
        /// The records.
        records: Vec<Bytes>,
    },
    /// Read consecutive records from `from` in one `Entries` answer.
    ReadRange {
        /// Log.
        log: String,
        /// First position wanted.
        from: u64,
        /// Most records wanted (at least 1; capped at
        /// [`MAX_RANGE_RECORDS`]).
        max_records: u32,
        /// Most record bytes wanted (at least 1; capped at
        /// [`MAX_RANGE_BYTES`]); the first record is sent even if it
        /// alone is longer.
        max_bytes: u32,
    },
    /// Push every entry from `from` on, as `Entries` answers of up to
    /// `max_records` records and `max_bytes` bytes.
    SubscribeBatches {
        /// Log.
        log: String,
        /// First position wanted.
        from: u64,
        /// Most records per answer (at least 1; capped at
        /// [`MAX_RANGE_RECORDS`]).
        max_records: u32,
        /// Most record bytes per answer (at least 1; capped at
        /// [`MAX_RANGE_BYTES`]); a longer record is sent alone.
        max_bytes: u32,
    },
}

/// A response frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// Authenticated.
    HelloOk,
    /// Appended at `pos`.
    Appended {
        /// Position.
        pos: u64,
    },
    /// A record (read or subscription).
    Entry {
        /// Position.
        pos: u64,
        /// Bytes.
        bytes: Bytes,
    },
    /// Bounds.
    Bounds {
        /// First readable.
        first: u64,
        /// Next position.
        tail: u64,
    },
    /// Trim done.
    Done,
    /// Pong.
    Pong,
    /// Positions of a batch, in order.
    AppendedBatch {
        /// Positions.
        positions: Vec<u64>,
    },
    /// Records at consecutive positions (a range read, or one batch of a
    /// batched subscription).
    Entries {
        /// Position of the first record.
        first: u64,
        /// The records, at `first`, `first + 1`, ...
        records: Vec<Bytes>,
    },
    /// Failure.
    Error {
        /// What kind.
        code: Code,
        /// First number.
        a: u64,
        /// Second number.
        b: u64,
        /// Human-readable.
        message: String,
    },
}

/// Why a frame was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Version byte is not ours.
    #[error("unsupported protocol version {0} (this server speaks {VERSION})")]
    Version(u8),
    /// Unknown type byte.
    #[error("unknown frame type {0}")]
    Type(u8),
    /// Truncated or trailing bytes, bad UTF-8.
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

struct Cur<'a> {
    b: &'a [u8],
}

impl<'a> Cur<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.b.len() < n {
            return Err(FrameError::Malformed("truncated"));
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn str8(&mut self) -> Result<String, FrameError> {
        let n = self.u8()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| FrameError::Malformed("bad UTF-8"))
    }
    fn str16(&mut self) -> Result<String, FrameError> {
        let n = self.u16()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| FrameError::Malformed("bad UTF-8"))
    }
    fn end(&self) -> Result<(), FrameError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Malformed("trailing bytes"))
        }
    }
}

fn put_str8(out: &mut BytesMut, s: &str) {
    let s = &s.as_bytes()[..s.len().min(255)];
    out.put_u8(s.len() as u8);
    out.put_slice(s);
}

fn put_str16(out: &mut BytesMut, s: &str) {
    let s = &s.as_bytes()[..s.len().min(u16::MAX as usize)];
    out.put_u16_le(s.len() as u16);
    out.put_slice(s);
}

fn head(out: &mut BytesMut, ty: u8, corr: u64) {
    out.put_u8(VERSION);
    out.put_u8(ty);
    out.put_u64_le(corr);
}

/// Encodes a request.
pub fn encode_request(corr: u64, r: &Request) -> Bytes {
    let mut o = BytesMut::with_capacity(32);
    match r {
        Request::Hello { token } => {
            head(&mut o, 1, corr);
            put_str16(&mut o, token);
        }
        Request::Append {
            log,
            client,
            request,
            bytes,
        } => {
            o.reserve(bytes.len() + log.len() + 32);
            head(&mut o, 2, corr);
            put_str8(&mut o, log);
            o.put_u64_le(*client);
            o.put_u64_le(*request);
            o.put_slice(bytes);
        }
        Request::Read { log, pos } => {
            head(&mut o, 3, corr);
            put_str8(&mut o, log);
            o.put_u64_le(*pos);
        }
        Request::Bounds { log } => {
            head(&mut o, 4, corr);
            put_str8(&mut o, log);
        }
        Request::Trim { log, pos } => {
            head(&mut o, 5, corr);
            put_str8(&mut o, log);
            o.put_u64_le(*pos);
        }
        Request::Subscribe { log, from } => {
            head(&mut o, 6, corr);
            put_str8(&mut o, log);
            o.put_u64_le(*from);
        }
        Request::Ping => head(&mut o, 7, corr),
        Request::AppendBatch {
            log,
            client,
            first_request,
            records,
        } => {
            o.reserve(records.iter().map(|r| r.len() + 4).sum::<usize>() + log.len() + 40);
            head(&mut o, 8, corr);
            put_str8(&mut o, log);
            o.put_u64_le(*client);
            o.put_u64_le(*first_request);
            o.put_u32_le(records.len() as u32);
            for r in records {
                o.put_u32_le(r.len() as u32);
                o.put_slice(r);
            }
        }
        Request::ReadRange {
            log,
            from,
            max_records,
            max_bytes,
        } => {
            head(&mut o, 9, corr);
            put_range(&mut o, log, *from, *max_records, *max_bytes);
        }
        Request::SubscribeBatches {
            log,
            from,
            max_records,
            max_bytes,
        } => {
            head(&mut o, 10, corr);
            put_range(&mut o, log, *from, *max_records, *max_bytes);
        }
    }
    o.freeze()
}

/// The fields `ReadRange` and `SubscribeBatches` share.
fn put_range(o: &mut BytesMut, log: &str, from: u64, max_records: u32, max_bytes: u32) {
    put_str8(o, log);
    o.put_u64_le(from);
    o.put_u32_le(max_records);
    o.put_u32_le(max_bytes);
}

/// `count:u32 (len:u32 bytes) x count`, each record a slice of `frame`;
/// the count is checked against the bytes left before the list is
/// allocated (each record takes at least its 4-byte length).
fn take_records(c: &mut Cur<'_>, frame: &Bytes) -> Result<Vec<Bytes>, FrameError> {
    let n = c.u32()? as usize;
    if n > c.b.len() / 4 {
        return Err(FrameError::Malformed("record count exceeds the frame"));
    }
    let mut records = Vec::with_capacity(n);
    for _ in 0..n {
        let len = c.u32()? as usize;
        let at = frame.len() - c.b.len();
        c.take(len)?;
        records.push(frame.slice(at..at + len));
    }
    Ok(records)
}

/// Decodes a request; on failure returns the correlation id if it was
/// readable, so the error frame can carry it.
pub fn decode_request(frame: &Bytes) -> Result<(u64, Request), (u64, FrameError)> {
    let mut c = Cur { b: frame };
    let v = c.u8().map_err(|e| (0, e))?;
    if v != VERSION {
        return Err((0, FrameError::Version(v)));
    }
    let ty = c.u8().map_err(|e| (0, e))?;
    let corr = c.u64().map_err(|e| (0, e))?;
    let r = (|| {
        Ok(match ty {
            1 => {
                let token = c.str16()?;
                c.end()?;
                Request::Hello { token }
            }
            2 => {
                let log = c.str8()?;
                let client = c.u64()?;
                let request = c.u64()?;
                let at = frame.len() - c.b.len();
                Request::Append {
                    log,
                    client,
                    request,
                    bytes: frame.slice(at..),
                }
            }
            3 => {
                let log = c.str8()?;
                let pos = c.u64()?;
                c.end()?;
                Request::Read { log, pos }
            }
            4 => {
                let log = c.str8()?;
                c.end()?;
                Request::Bounds { log }
            }
            5 => {
                let log = c.str8()?;
                let pos = c.u64()?;
                c.end()?;
                Request::Trim { log, pos }
            }
            6 => {
                let log = c.str8()?;
                let from = c.u64()?;
                c.end()?;
                Request::Subscribe { log, from }
            }
            7 => {
                c.end()?;
                Request::Ping
            }
            8 => {
                let log = c.str8()?;
                let client = c.u64()?;
                let first_request = c.u64()?;
                let records = take_records(&mut c, frame)?;
                c.end()?;
                Request::AppendBatch {
                    log,
                    client,
                    first_request,
                    records,
                }
            }
            9 | 10 => {
                let log = c.str8()?;
                let from = c.u64()?;
                let max_records = c.u32()?;
                let max_bytes = c.u32()?;
                c.end()?;
                if ty == 9 {
                    Request::ReadRange {
                        log,
                        from,
                        max_records,
                        max_bytes,
                    }
                } else {
                    Request::SubscribeBatches {
                        log,
                        from,
                        max_records,
                        max_bytes,
                    }
                }
            }
            t => return Err(FrameError::Type(t)),
        })
    })();
    r.map(|r| (corr, r)).map_err(|e| (corr, e))
}

/// Encodes a response.
pub fn encode_response(corr: u64, r: &Response) -> Bytes {
    let mut o = BytesMut::with_capacity(32);
    match r {
        Response::HelloOk => {
            head(&mut o, 101, corr);
            o.put_u8(VERSION);
        }
        Response::Appended { pos } => {
            head(&mut o, 102, corr);
            o.put_u64_le(*pos);
        }
        Response::Entry { pos, bytes } => {
            o.reserve(bytes.len() + 24);
            head(&mut o, 103, corr);
            o.put_u64_le(*pos);
            o.put_slice(bytes);
        }
        Response::Bounds { first, tail } => {
            head(&mut o, 104, corr);
            o.put_u64_le(*first);
            o.put_u64_le(*tail);
        }
        Response::Done => head(&mut o, 105, corr),
        Response::Pong => head(&mut o, 107, corr),
        Response::AppendedBatch { positions } => {
            head(&mut o, 108, corr);
            o.put_u32_le(positions.len() as u32);
            for p in positions {
                o.put_u64_le(*p);
            }
        }
        Response::Entries { first, records } => {
            o.reserve(entries_frame_len(records.iter().map(|r| r.len())));
            head(&mut o, 109, corr);
            o.put_u64_le(*first);
            o.put_u32_le(records.len() as u32);
            for r in records {
                o.put_u32_le(r.len() as u32);
                o.put_slice(r);
            }
        }
        Response::Error {
            code,
            a,
            b,
            message,
        } => {
            head(&mut o, 200, corr);
            o.put_u16_le(*code as u16);
            o.put_u64_le(*a);
            o.put_u64_le(*b);
            put_str16(&mut o, message);
        }
    }
    o.freeze()
}

/// Decodes a response.
pub fn decode_response(frame: &Bytes) -> Result<(u64, Response), FrameError> {
    let mut c = Cur { b: frame };
    let v = c.u8()?;
    if v != VERSION {
        return Err(FrameError::Version(v));
    }
    let ty = c.u8()?;
    let corr = c.u64()?;
    let r = match ty {
        101 => {
            // The server's version, which the frame header already states:
            // a frame whose two disagree is not one this build wrote.
            let v = c.u8()?;
            if v != VERSION {
                return Err(FrameError::Version(v));
            }
            Response::HelloOk
        }
        102 => Response::Appended { pos: c.u64()? },
        103 => {
            let pos = c.u64()?;
            let at = frame.len() - c.b.len();
            c.b = &[];
            Response::Entry {
                pos,
                bytes: frame.slice(at..),
            }
        }
        104 => Response::Bounds {
            first: c.u64()?,
            tail: c.u64()?,
        },
        105 => Response::Done,
        107 => Response::Pong,
        108 => {
            let n = c.u32()? as usize;
            if n > c.b.len() / 8 {
                return Err(FrameError::Malformed("position count exceeds the frame"));
            }
            let mut positions = Vec::with_capacity(n);
            for _ in 0..n {
                positions.push(c.u64()?);
            }
            Response::AppendedBatch { positions }
        }
        109 => Response::Entries {
            first: c.u64()?,
            records: take_records(&mut c, frame)?,
        },
        200 => Response::Error {
            code: Code::from_u16(c.u16()?),
            a: c.u64()?,
            b: c.u64()?,
            message: c.str16()?,
        },
        t => return Err(FrameError::Type(t)),
    };
    c.end()?;
    Ok((corr, r))
}

/// The error frame for a store error.
pub fn store_error(e: &StoreError) -> Response {
    let (code, a, b) = match e {
        StoreError::BadLogName(_) => (Code::BadLogName, 0, 0),
        StoreError::NotYetWritten { pos, tail, .. } => (Code::NotYetWritten, *pos, *tail),
        StoreError::Trimmed { pos, first, .. } => (Code::Trimmed, *pos, *first),
        StoreError::TrimBeyondTail { pos, tail, .. } => (Code::TrimBeyondTail, *pos, *tail),
        StoreError::TooLarge { len, limit } => (Code::TooLarge, *len as u64, *limit as u64),
        StoreError::Full(n) => (Code::Full, *n, 0),
        StoreError::WriteFailed(_) => (Code::WriteFailed, 0, 0),
        StoreError::NoSpace(_) => (Code::NoSpace, 0, 0),
        StoreError::Exhausted(_) => (Code::Exhausted, 0, 0),
        StoreError::Unrecoverable { stripe, .. } => (Code::Unrecoverable, *stripe, 0),
        StoreError::ShuttingDown => (Code::ShuttingDown, 0, 0),
    };
    Response::Error {
        code,
        a,
        b,
        message: e.to_string(),
    }
}

/// The error frame for a frame over a reader's limit: error 7 with the
/// frame's length and the limit, as `StoreError::TooLarge` reports a record.
pub(crate) fn too_large(len: u64, limit: u64, message: String) -> Response {
    Response::Error {
        code: Code::TooLarge,
        a: len,
        b: limit,
        message,
    }
}

/// An error frame.
pub fn error(code: Code, message: impl Into<String>) -> Response {
    Response::Error {
        code,
        a: 0,
        b: 0,
        message: message.into(),
    }
}

#[cfg(test)]
mod tests;
