//! TCP framing for the service and the client: each frame is its length
//! as a little-endian `u32`, then that many bytes (see
//! [`crate::protocol`]). Writing uses a stock codec ([`encoder`]); reading
//! uses [`FrameDecoder`].
//!
//! A frame longer than the reader's limit is refused without allocating
//! it, like a stock length-delimited codec would, but not by closing the
//! connection: the decoder reads the frame's header (version, type and
//! correlation id, the first ten bytes; requests and answers share it),
//! reports the frame so that one request can fail with `TooLarge`, and
//! then discards the frame's bytes as they arrive. Closing instead would
//! fail every other request in flight on the connection, and a client that
//! retries on a lost connection would send the same request again and
//! again until it gave up; an error under the request's own id fails just
//! that request, for good.
//!
//! A frame whose header is not this protocol's (an unknown version byte)
//! still closes the connection: its length is then no evidence of where
//! the next frame starts.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, LengthDelimitedCodec};

use crate::protocol::VERSION;

/// Bytes of the length prefix.
const PREFIX: usize = 4;
/// Bytes of a frame's header read from an oversized frame: version, type
/// and correlation id.
const HEADER: usize = 1 + 1 + 8;

/// The codec that writes frames of at most `max` bytes (a longer one
/// fails its write).
pub(crate) fn encoder(max: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .little_endian()
        .length_field_type::<u32>()
        .max_frame_length(max)
        .new_codec()
}

/// What the decoder yields.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Incoming {
    /// A whole frame within the limit.
    Frame(Bytes),
    /// A frame over the limit, with this protocol's version byte; its
    /// bytes are being discarded, and the connection goes on after them.
    Oversized {
        /// The frame's correlation id.
        corr: u64,
        /// The frame's length, from its prefix.
        len: u64,
        /// The limit it exceeds.
        limit: u64,
    },
}

/// Decodes length-prefixed frames of at most `max` bytes (see the module
/// comment for what happens to a longer one).
#[derive(Debug)]
pub(crate) struct FrameDecoder {
    max: usize,
    /// Bytes of an oversized frame still to discard.
    skip: u64,
}

impl FrameDecoder {
    /// A decoder for frames of at most `max` bytes.
    pub(crate) fn new(max: usize) -> FrameDecoder {
        FrameDecoder { max, skip: 0 }
    }

    /// Drops what is buffered of the frame being discarded.
    fn discard(&mut self, src: &mut BytesMut) {
        let n = (src.len() as u64).min(self.skip);
        src.advance(n as usize);
        self.skip -= n;
    }
}

impl Decoder for FrameDecoder {
    type Item = Incoming;
    type Error = io::Error;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Incoming>, io::Error> {
        if self.skip > 0 {
            self.discard(src);
            if self.skip > 0 {
                return Ok(None);
            }
        }
        let Some(prefix) = src.get(..PREFIX) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize;
        if len <= self.max {
            if src.len() < PREFIX + len {
                // Room for the rest of this frame only: `len` is bounded.
                src.reserve(PREFIX + len - src.len());
                return Ok(None);
            }
            src.advance(PREFIX);
            return Ok(Some(Incoming::Frame(src.split_to(len).freeze())));
        }
        if len < HEADER {
            // Cannot hold a header (only with a limit below ten bytes,
            // which the configuration refuses); nothing names the request.
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "frame of {len} bytes exceeds the limit of {} bytes",
                    self.max
                ),
            ));
        }
        let Some(head) = src.get(PREFIX..PREFIX + HEADER) else {
            return Ok(None);
        };
        if head[0] != VERSION {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "frame of {len} bytes exceeds the limit of {} bytes, and its version byte {} is not {VERSION}",
                    self.max, head[0]
                ),
            ));
        }
        let mut corr = [0u8; 8];
        corr.copy_from_slice(&head[2..]);
        src.advance(PREFIX);
        self.skip = len as u64;
        self.discard(src);
        Ok(Some(Incoming::Oversized {
            corr: u64::from_le_bytes(corr),
            len: len as u64,
            limit: self.max as u64,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{encode_request, Request};

    fn framed(frame: &[u8]) -> Vec<u8> {
        let mut v = (frame.len() as u32).to_le_bytes().to_vec();
        v.extend_from_slice(frame);
        v
    }

    fn append(corr: u64, bytes: usize) -> Bytes {
        encode_request(
            corr,
            &Request::Append {
                log: "l".into(),
                client: 1,
                request: corr,
                bytes: Bytes::from(vec![9u8; bytes]),
            },
        )
    }

    /// Feeds `stream` to a decoder in chunks of `chunk` bytes and collects
    /// what it yields; also the largest buffer capacity seen.
    fn feed(max: usize, stream: &[u8], chunk: usize) -> (Vec<Incoming>, usize) {
        let mut d = FrameDecoder::new(max);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut most = 0;
        for c in stream.chunks(chunk) {
            buf.extend_from_slice(c);
            most = most.max(buf.capacity());
            while let Some(item) = d.decode(&mut buf).expect("decodes") {
                out.push(item);
            }
            most = most.max(buf.capacity());
        }
        assert!(buf.is_empty(), "{} bytes left over", buf.len());
        (out, most)
    }

    #[test]
    fn an_oversized_frame_is_named_skipped_and_the_next_frame_decodes() {
        let small = append(1, 10);
        let big = append(2, 5000);
        let after = encode_request(3, &Request::Ping);
        let mut stream = framed(&small);
        stream.extend(framed(&big));
        stream.extend(framed(&after));
        for chunk in [1, 3, 7, 64, 1000, stream.len()] {
            let (out, most) = feed(1000, &stream, chunk);
            assert_eq!(
                out,
                vec![
                    Incoming::Frame(small.clone()),
                    Incoming::Oversized {
                        corr: 2,
                        len: big.len() as u64,
                        limit: 1000
                    },
                    Incoming::Frame(after.clone()),
                ],
                "chunks of {chunk}"
            );
            if chunk < 1000 {
                // The discarded frame was never buffered whole.
                assert!(
                    most < big.len(),
                    "buffer grew to {most} (chunks of {chunk})"
                );
            }
        }
    }

    proptest::proptest! {
        /// Against a model: frames within the limit come out whole, longer
        /// ones as `Oversized` with their header's id, whatever the chunking;
        /// and the decoder never holds more than one frame within the limit.
        #[test]
        fn any_chunking_of_any_frames_decodes_as_the_model_says(
            max in 16usize..200,
            frames in proptest::collection::vec((0usize..600, proptest::num::u64::ANY), 0..12),
            chunk in 1usize..700,
        ) {
            let mut stream = Vec::new();
            let mut want = Vec::new();
            for (i, &(len, corr)) in frames.iter().enumerate() {
                let len = len.max(HEADER);
                let mut f = vec![VERSION, 2];
                f.extend_from_slice(&corr.to_le_bytes());
                f.resize(len, i as u8);
                stream.extend(framed(&f));
                want.push(if len <= max {
                    Incoming::Frame(Bytes::from(f))
                } else {
                    Incoming::Oversized { corr, len: len as u64, limit: max as u64 }
                });
            }
            let mut d = FrameDecoder::new(max);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for c in stream.chunks(chunk) {
                buf.extend_from_slice(c);
                while let Some(item) = d.decode(&mut buf).expect("valid frames decode") {
                    got.push(item);
                }
                proptest::prop_assert!(buf.len() < PREFIX + max, "{} bytes held", buf.len());
            }
            proptest::prop_assert!(buf.is_empty());
            proptest::prop_assert_eq!(got, want);
        }

        /// Arbitrary bytes never panic the decoder, and it never holds
        /// more than one frame within the limit.
        #[test]
        fn arbitrary_bytes_never_panic(
            max in 10usize..100,
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..2000),
            chunk in 1usize..300,
        ) {
            let mut d = FrameDecoder::new(max);
            let mut buf = BytesMut::new();
            'feed: for c in bytes.chunks(chunk) {
                buf.extend_from_slice(c);
                loop {
                    match d.decode(&mut buf) {
                        Ok(Some(_)) => {}
                        Ok(None) => break,
                        Err(_) => break 'feed,
                    }
                }
                proptest::prop_assert!(buf.len() < PREFIX + max.max(HEADER));
            }
        }
    }

    #[test]
    fn a_frame_at_the_limit_is_a_frame() {
        let f = append(4, 0);
        let (out, _) = feed(f.len(), &framed(&f), 5);
        assert_eq!(out, vec![Incoming::Frame(f)]);
    }

    #[test]
    fn an_oversized_prefix_waits_for_the_header() {
        let mut d = FrameDecoder::new(100);
        let mut buf = BytesMut::from(&u32::MAX.to_le_bytes()[..]);
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(&[VERSION, 2, 7, 0, 0, 0]);
        assert_eq!(d.decode(&mut buf).unwrap(), None);
        buf.extend_from_slice(&[0, 0, 0, 0, 1, 2, 3]);
        assert_eq!(
            d.decode(&mut buf).unwrap(),
            Some(Incoming::Oversized {
                corr: 7,
                len: u32::MAX as u64,
                limit: 100
            })
        );
        assert!(buf.is_empty());
        assert_eq!(d.skip, u32::MAX as u64 - 13);
    }

    #[test]
    fn an_oversized_frame_of_another_protocol_is_an_error() {
        let mut d = FrameDecoder::new(100);
        let mut buf = BytesMut::from(&b"GET / HTTP/1.1\r\n"[..]);
        let e = d.decode(&mut buf).unwrap_err();
        assert!(
            e.to_string().contains("exceeds the limit of 100 bytes"),
            "{e}"
        );
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let mut d = FrameDecoder::new(4);
        let mut buf = BytesMut::from(&[5u8, 0, 0, 0, 1][..]);
        assert!(d.decode(&mut buf).is_err());
    }
}
