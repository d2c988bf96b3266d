//! [`Bytes`]: an immutable byte string that stores short values inline.
//!
//! Keys and values of up to 22 bytes live inside the tree node itself, so a
//! node is one allocation; longer ones are shared behind an `Arc` between
//! the versions of a node. Meld creates and frees many nodes per
//! transaction, so this matters on its critical path.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

const INLINE: usize = 22;

/// An immutable, cheaply cloned byte string (a key or a value).
#[derive(Clone)]
pub struct Bytes(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, data: [u8; INLINE] },
    Shared(Arc<[u8]>),
}

impl Bytes {
    /// The bytes as a slice.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, data } => &data[..*len as usize],
            Repr::Shared(a) => a,
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Borrow<[u8]> for Bytes {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<&[u8]> for Bytes {
    fn from(b: &[u8]) -> Bytes {
        if b.len() <= INLINE {
            let mut data = [0u8; INLINE];
            data[..b.len()].copy_from_slice(b);
            Bytes(Repr::Inline {
                len: b.len() as u8,
                data,
            })
        } else {
            Bytes(Repr::Shared(b.into()))
        }
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        if v.len() <= INLINE {
            Bytes::from(&v[..])
        } else {
            Bytes(Repr::Shared(v.into()))
        }
    }
}

impl From<&str> for Bytes {
    fn from(s: &str) -> Bytes {
        Bytes::from(s.as_bytes())
    }
}

impl<const N: usize> From<&[u8; N]> for Bytes {
    fn from(b: &[u8; N]) -> Bytes {
        Bytes::from(&b[..])
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Bytes {}

impl PartialEq<[u8]> for Bytes {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl PartialOrd for Bytes {
    fn partial_cmp(&self, other: &Bytes) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bytes {
    fn cmp(&self, other: &Bytes) -> Ordering {
        self.as_slice().cmp(other.as_slice())
    }
}

impl Hash for Bytes {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.as_slice().hash(h)
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\"", self.as_slice().escape_ascii())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_shared_behave_alike() {
        for len in [0usize, 1, 21, 22, 23, 100] {
            let v: Vec<u8> = (0..len as u8).collect();
            let a = Bytes::from(&v[..]);
            let b = Bytes::from(v.clone());
            assert_eq!(&a[..], &v[..]);
            assert_eq!(a, b);
            assert_eq!(a.clone().to_vec(), v);
        }
        let (a, ab) = (Bytes::from(&b"a"[..]), Bytes::from(&b"ab"[..]));
        assert!(a < ab);
        let (long, short) = (Bytes::from(&[9u8; 30][..]), Bytes::from(&[9u8; 22][..]));
        assert!(long > short);
    }
}
