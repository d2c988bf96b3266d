//! Key ranges: scan bounds and the DependencyRange of phantom protection.

use std::cmp::Ordering;
use std::ops::Bound;

use crate::bytes::cmp_keys;
use crate::bytes::Bytes;

/// Scan direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Ascending keys.
    Forward,
    /// Descending keys.
    Reverse,
}

/// A range of keys with inclusive, exclusive or open ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    /// Lower end.
    pub start: Bound<Bytes>,
    /// Upper end.
    pub end: Bound<Bytes>,
}

/// A borrowed range used inside algorithms.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RangeRef<'a> {
    pub(crate) start: Bound<&'a [u8]>,
    pub(crate) end: Bound<&'a [u8]>,
}

impl KeyRange {
    /// The range holding exactly `key`.
    pub fn point(key: &[u8]) -> KeyRange {
        let k: Bytes = key.into();
        KeyRange {
            start: Bound::Included(k.clone()),
            end: Bound::Included(k),
        }
    }
    /// Every key.
    pub fn all() -> KeyRange {
        KeyRange {
            start: Bound::Unbounded,
            end: Bound::Unbounded,
        }
    }
    pub(crate) fn as_ref(&self) -> RangeRef<'_> {
        RangeRef {
            start: self.start.as_ref().map(|b| &b[..]),
            end: self.end.as_ref().map(|b| &b[..]),
        }
    }
    /// Whether `key` lies in the range.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.as_ref().contains(key)
    }
    /// Whether no key can lie in the range.
    pub fn is_empty(&self) -> bool {
        self.as_ref().is_empty()
    }
}

impl<'a> RangeRef<'a> {
    #[inline]
    pub(crate) fn above_start(&self, key: &[u8]) -> bool {
        match self.start {
            Bound::Unbounded => true,
            Bound::Included(s) => key >= s,
            Bound::Excluded(s) => key > s,
        }
    }
    #[inline]
    pub(crate) fn below_end(&self, key: &[u8]) -> bool {
        match self.end {
            Bound::Unbounded => true,
            Bound::Included(e) => key <= e,
            Bound::Excluded(e) => key < e,
        }
    }
    #[inline(always)]
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.above_start(key) && self.below_end(key)
    }
    pub(crate) fn is_empty(&self) -> bool {
        match (self.start, self.end) {
            (Bound::Included(s), Bound::Included(e)) => s > e,
            (Bound::Included(s), Bound::Excluded(e))
            | (Bound::Excluded(s), Bound::Included(e))
            | (Bound::Excluded(s), Bound::Excluded(e)) => s >= e,
            _ => false,
        }
    }
    /// The part of the range below `key` (exclusive).
    pub(crate) fn below(self, key: &'a [u8]) -> RangeRef<'a> {
        let end = match self.end {
            Bound::Included(e) | Bound::Excluded(e) if e < key => self.end,
            _ => Bound::Excluded(key),
        };
        RangeRef {
            start: self.start,
            end,
        }
    }
    /// The part of the range above `key` (exclusive).
    pub(crate) fn above(self, key: &'a [u8]) -> RangeRef<'a> {
        let start = match self.start {
            Bound::Included(s) | Bound::Excluded(s) if s > key => self.start,
            _ => Bound::Excluded(key),
        };
        RangeRef {
            start,
            end: self.end,
        }
    }
    /// Whether every key of the range is smaller than `key`.
    #[inline]
    pub(crate) fn all_below(&self, key: &[u8]) -> bool {
        match self.end {
            Bound::Unbounded => false,
            Bound::Included(e) => e < key,
            Bound::Excluded(e) => e <= key,
        }
    }
    /// Whether every key of the range is larger than `key`.
    #[inline]
    pub(crate) fn all_above(&self, key: &[u8]) -> bool {
        match self.start {
            Bound::Unbounded => false,
            Bound::Included(s) => s > key,
            Bound::Excluded(s) => s >= key,
        }
    }
}

/// Open interval used by meld's recursion: keys strictly between `lo` and `hi`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gap<'a> {
    pub(crate) lo: Option<&'a [u8]>,
    pub(crate) hi: Option<&'a [u8]>,
}

impl<'a> Gap<'a> {
    pub(crate) const ALL: Gap<'static> = Gap { lo: None, hi: None };
    #[inline(always)]
    pub(crate) fn cmp_key(&self, key: &[u8]) -> Ordering {
        if let Some(lo) = self.lo {
            if cmp_keys(key, lo) != Ordering::Greater {
                return Ordering::Less;
            }
        }
        if let Some(hi) = self.hi {
            if cmp_keys(key, hi) != Ordering::Less {
                return Ordering::Greater;
            }
        }
        Ordering::Equal
    }
    #[inline(always)]
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.cmp_key(key) == Ordering::Equal
    }
    pub(crate) fn left_of(self, key: &'a [u8]) -> Gap<'a> {
        Gap {
            lo: self.lo,
            hi: Some(key),
        }
    }
    pub(crate) fn right_of(self, key: &'a [u8]) -> Gap<'a> {
        Gap {
            lo: Some(key),
            hi: self.hi,
        }
    }
    pub(crate) fn as_range(self) -> RangeRef<'a> {
        RangeRef {
            start: self.lo.map_or(Bound::Unbounded, Bound::Excluded),
            end: self.hi.map_or(Bound::Unbounded, Bound::Excluded),
        }
    }
}
