//! Raw devices as segment stores (`devices` in the configuration): one
//! device per zone, a block device or a fixed-size file standing in for
//! one, cut into slots that each hold one segment at a time.
//!
//! A file system gives segments names: creating, renaming and deleting a
//! file is how a segment comes, goes and is replaced. A raw device has no
//! names, so each slot starts with a header that says what the slot holds,
//! and the device starts with a label that says how it is cut:
//!
//! ```text
//! 0                        label (4 KiB): magic "MLDV", crc32, version,
//!                          zone, zones, segment_bytes, slot_bytes
//! 4096 + i * (4096 + S)    slot i header (4 KiB): magic "MLDS", crc32,
//!                          version, state, i, S, segment, generation
//! 8192 + i * (4096 + S)    slot i data: S = slot_bytes bytes
//! ```
//!
//! A slot is *free* (contents unknown: a header that does not verify
//! counts as free), *spare* (data all zeros) or holds *segment* `id`. A
//! segment's space beyond its data holds zeros, as in a spare file, so a
//! scan finds where the data ends: a slot is zeroed before it takes a
//! segment. Every header write carries the device's next generation, so
//! when two slots name the same segment (a crash in the middle of a
//! repair, which writes the rebuilt segment into another slot, then its
//! header, then frees the old slot) the newer one wins.
//!
//! Writing a header is the device's counterpart of a rename plus a
//! directory fsync: the writer makes it durable before any page of the
//! segment is written, so a crash never leaves pages in a slot whose
//! header says something else.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::{ConfigError, OpenError};
use crate::seg_file::SegFile;

/// Bytes of the device label and of each slot header: one block, so a
/// header write never shares a block with segment data and direct writes
/// keep their alignment.
pub const HEADER_BYTES: u64 = 4096;

/// Room a slot has beyond `segment_bytes`: the windows count a segment
/// full at `segment_bytes`, but class markers (a few dozen bytes each, at
/// most four per segment) may land after that.
pub const SLOT_SLACK: u64 = 64 << 10;

const LABEL_MAGIC: &[u8; 4] = b"MLDV";
const SLOT_MAGIC: &[u8; 4] = b"MLDS";
const VERSION: u8 = 1;

/// How a device is cut, as its label records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label {
    /// The zone the device belongs to.
    pub zone: u32,
    /// How many zones the store has.
    pub zones: u32,
    /// The configured `segment_bytes`.
    pub segment_bytes: u64,
    /// Data bytes of each slot.
    pub slot_bytes: u64,
}

/// Bytes of an encoded label (the rest of its block is zeros).
const LABEL_LEN: usize = 40;

impl Label {
    /// The label's bytes.
    pub fn encode(&self) -> [u8; LABEL_LEN] {
        let mut b = [0u8; LABEL_LEN];
        b[..4].copy_from_slice(LABEL_MAGIC);
        b[8] = VERSION;
        b[12..16].copy_from_slice(&self.zone.to_le_bytes());
        b[16..20].copy_from_slice(&self.zones.to_le_bytes());
        b[24..32].copy_from_slice(&self.segment_bytes.to_le_bytes());
        b[32..40].copy_from_slice(&self.slot_bytes.to_le_bytes());
        let crc = crc32fast::hash(&b[8..]);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// A label from the device's first bytes, if they are one.
    pub fn decode(b: &[u8]) -> Option<Label> {
        let b = b.get(..LABEL_LEN)?;
        if &b[..4] != LABEL_MAGIC
            || u32::from_le_bytes(b[4..8].try_into().ok()?) != crc32fast::hash(&b[8..])
            || b[8] != VERSION
        {
            return None;
        }
        Some(Label {
            zone: u32::from_le_bytes(b[12..16].try_into().ok()?),
            zones: u32::from_le_bytes(b[16..20].try_into().ok()?),
            segment_bytes: u64::from_le_bytes(b[24..32].try_into().ok()?),
            slot_bytes: u64::from_le_bytes(b[32..40].try_into().ok()?),
        })
    }
}

/// What a slot holds, as its header records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Nothing; its bytes are unknown.
    Free,
    /// Nothing; its data is all zeros.
    Spare,
    /// Segment `id`.
    Segment(u64),
}

/// Bytes of an encoded slot header.
const SLOT_LEN: usize = 48;

/// A slot header's bytes: what slot `slot` of `slot_bytes` holds, written
/// at generation `gen`.
pub fn encode_slot(held: Held, slot: u64, slot_bytes: u64, gen: u64) -> [u8; SLOT_LEN] {
    let mut b = [0u8; SLOT_LEN];
    b[..4].copy_from_slice(SLOT_MAGIC);
    b[8] = VERSION;
    let (state, id) = match held {
        Held::Free => (0, 0),
        Held::Spare => (1, 0),
        Held::Segment(id) => (2, id),
    };
    b[9] = state;
    b[16..24].copy_from_slice(&slot.to_le_bytes());
    b[24..32].copy_from_slice(&slot_bytes.to_le_bytes());
    b[32..40].copy_from_slice(&id.to_le_bytes());
    b[40..48].copy_from_slice(&gen.to_le_bytes());
    let crc = crc32fast::hash(&b[8..]);
    b[4..8].copy_from_slice(&crc.to_le_bytes());
    b
}

/// What slot `slot` of `slot_bytes` holds and the header's generation,
/// if `b` is a header written for exactly that slot of that size (one
/// left over from a device cut another way does not count).
pub fn decode_slot(b: &[u8], slot: u64, slot_bytes: u64) -> Option<(Held, u64)> {
    let b = b.get(..SLOT_LEN)?;
    let u64_at = |at: usize| b[at..at + 8].try_into().ok().map(u64::from_le_bytes);
    if &b[..4] != SLOT_MAGIC
        || u32::from_le_bytes(b[4..8].try_into().ok()?) != crc32fast::hash(&b[8..])
        || b[8] != VERSION
        || u64_at(16)? != slot
        || u64_at(24)? != slot_bytes
    {
        return None;
    }
    let held = match b[9] {
        0 => Held::Free,
        1 => Held::Spare,
        2 => Held::Segment(u64_at(32)?),
        _ => return None,
    };
    let gen = u64_at(40)?;
    // Generations count header writes from 1, so no store reaches 2^63;
    // a header claiming one was not written by a store (forged, or
    // another program's), and refusing it keeps `gen + 1` from
    // overflowing in the open and in every later header write.
    if gen >= MAX_GENERATION {
        return None;
    }
    Some((held, gen))
}

/// Generations at and above this are refused as headers ([`decode_slot`]).
pub const MAX_GENERATION: u64 = 1 << 63;

/// An open that finds a generation at or above this numbers the headers
/// again from 1, so that the header writes after it stay below
/// [`MAX_GENERATION`].
const RENUMBER_AT: u64 = 1 << 62;

/// A slot as the device's table tracks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// As the header says.
    At(Held),
    /// Taken by someone who is zeroing or assigning it.
    Busy,
}

struct Table {
    slots: Vec<Slot>,
    /// The generation the next header write gets.
    gen: u64,
}

/// One zone's device, cut into slots.
pub struct Device {
    path: PathBuf,
    file: File,
    /// A block device (zeroed by the device itself, see [`Device::zero`]).
    block: bool,
    zone: usize,
    slot_bytes: u64,
    table: Mutex<Table>,
}

/// Data bytes per slot for segments of `segment_bytes`: the segment, the
/// slack for markers, rounded up to a block.
pub fn slot_bytes(segment_bytes: u64) -> u64 {
    (segment_bytes + SLOT_SLACK).next_multiple_of(HEADER_BYTES)
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("path", &self.path)
            .field("zone", &self.zone)
            .field("slots", &self.slots())
            .finish()
    }
}

fn bad(why: String) -> OpenError {
    OpenError::Config(ConfigError::Invalid(why))
}

impl Device {
    /// Opens zone `zone`'s device (of `zones`) at `path`, labelling it if
    /// its first block is all zeros (a new or wiped device), and reads
    /// every slot header. Refuses a device labelled for another zone or
    /// another segment size, one whose first block is something else
    /// (never overwritten: it may be another program's data), and one too
    /// small for a slot. Two slots naming one segment: the later header
    /// wins and the other slot is freed.
    pub fn open(
        path: &Path,
        zone: usize,
        zones: usize,
        segment_bytes: u64,
    ) -> Result<Device, OpenError> {
        let io_err = |source| OpenError::Io {
            path: path.to_path_buf(),
            source,
        };
        let (file, block) = open_exclusive(path, HELD_WAIT).map_err(|e| {
            if e.kind() == io::ErrorKind::ResourceBusy {
                OpenError::DeviceInUse {
                    device: path.to_path_buf(),
                    reason: e.to_string(),
                }
            } else {
                io_err(e)
            }
        })?;
        let size = device_size(&file).map_err(io_err)?;
        let want = Label {
            zone: zone as u32,
            zones: zones as u32,
            segment_bytes,
            slot_bytes: slot_bytes(segment_bytes),
        };
        let slot_span = HEADER_BYTES + want.slot_bytes;
        let slots = size.saturating_sub(HEADER_BYTES) / slot_span;
        if slots == 0 {
            return Err(bad(format!(
                "device {} has {size} bytes, too small for one slot of {slot_span} bytes (segment_bytes {segment_bytes} plus headers)",
                path.display()
            )));
        }
        let mut first = vec![0u8; HEADER_BYTES as usize];
        file.read_exact_at(&mut first, 0).map_err(io_err)?;
        match Label::decode(&first) {
            Some(l) if l == want => {}
            Some(l) => {
                return Err(bad(format!(
                    "device {} is labelled for zone {} of {} with segment_bytes {}, but is configured as zone {zone} of {zones} with segment_bytes {segment_bytes}: the devices list changed order or segment_bytes changed",
                    path.display(),
                    l.zone,
                    l.zones,
                    l.segment_bytes
                )))
            }
            None if first.iter().all(|&b| b == 0) => {
                tracing::info!(device = %path.display(), zone, slots, "labelling a new device");
                first[..LABEL_LEN].copy_from_slice(&want.encode());
                file.write_all_at(&first, 0)
                    .and_then(|_| file.sync_data())
                    .map_err(io_err)?;
            }
            None => {
                return Err(bad(format!(
                    "device {} holds data that is not a MeldDB log label; if it is meant for the log, zero its first 4 KiB (dd if=/dev/zero of={} bs=4096 count=1)",
                    path.display(),
                    path.display()
                )))
            }
        }
        let dev = Device {
            path: path.to_path_buf(),
            file,
            block,
            zone,
            slot_bytes: want.slot_bytes,
            table: Mutex::new(Table {
                slots: Vec::new(),
                gen: 1,
            }),
        };
        let mut held = Vec::with_capacity(slots as usize);
        let mut gen = 0;
        let mut buf = [0u8; SLOT_LEN];
        for i in 0..slots {
            dev.file
                .read_exact_at(&mut buf, dev.header_at(i))
                .map_err(io_err)?;
            let h = decode_slot(&buf, i, dev.slot_bytes);
            gen = gen.max(h.map_or(0, |h| h.1));
            held.push(h);
        }
        // Newest header per segment; the rest are stale.
        let mut newest: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        for (i, h) in held.iter().enumerate() {
            if let Some((Held::Segment(id), g)) = h {
                let e = newest.entry(*id).or_insert((*g, i as u64));
                if *g > e.0 {
                    *e = (*g, i as u64);
                }
            }
        }
        let mut stale = Vec::new();
        let table: Vec<Slot> = held
            .iter()
            .enumerate()
            .map(|(i, h)| match h {
                Some((Held::Segment(id), _)) if newest.get(id).is_some_and(|n| n.1 != i as u64) => {
                    stale.push(i as u64);
                    Slot::At(Held::Free)
                }
                Some((held, _)) => Slot::At(*held),
                None => Slot::At(Held::Free),
            })
            .collect();
        {
            let mut t = dev.lock();
            t.slots = table;
            t.gen = gen + 1;
        }
        for &i in &stale {
            tracing::warn!(device = %path.display(), slot = i, "freeing a slot whose segment a newer slot holds (a repair was cut short)");
            dev.write_header(i, Held::Free).map_err(io_err)?;
        }
        let renumber = gen >= RENUMBER_AT;
        if renumber {
            // Only a header this store did not write gets here (counting
            // from 1 never reaches 2^62). Generations only order two
            // headers naming one segment, and with the stale ones freed
            // above each segment has one, so any numbering is right, and
            // so is any mix of old and new after a crash half-way.
            tracing::warn!(device = %path.display(), generation = gen, "slot headers carry a generation no store reaches by counting: numbering them again from 1");
            let states: Vec<Slot> = dev.lock().slots.clone();
            dev.lock().gen = 1;
            for (i, s) in states.into_iter().enumerate() {
                if let Slot::At(held) = s {
                    dev.write_header(i as u64, held).map_err(io_err)?;
                }
            }
        }
        if !stale.is_empty() || renumber {
            dev.sync().map_err(io_err)?;
        }
        Ok(dev)
    }

    /// The segments the device holds, as `(segment, slot)`, by segment.
    pub fn segments(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self
            .lock()
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s {
                Slot::At(Held::Segment(id)) => Some((*id, i as u64)),
                _ => None,
            })
            .collect();
        v.sort_unstable();
        v
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        crate::locks::lock(&self.table)
    }

    /// The device's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Slots on the device.
    pub fn slots(&self) -> u64 {
        self.lock().slots.len() as u64
    }

    /// Data bytes per slot.
    pub fn slot_bytes(&self) -> u64 {
        self.slot_bytes
    }

    fn header_at(&self, slot: u64) -> u64 {
        HEADER_BYTES + slot * (HEADER_BYTES + self.slot_bytes)
    }

    /// Segment data of `slot`, as its own descriptor.
    pub fn seg_file(&self, slot: u64) -> io::Result<SegFile> {
        Ok(SegFile::slot(
            self.file.try_clone()?,
            self.header_at(slot) + HEADER_BYTES,
            self.slot_bytes,
        ))
    }

    /// Writes `slot`'s header (not durable until [`Device::sync`]) and
    /// records it in the table.
    fn write_header(&self, slot: u64, held: Held) -> io::Result<()> {
        let mut t = self.lock();
        let gen = t.gen;
        t.gen += 1;
        let mut block = vec![0u8; HEADER_BYTES as usize];
        block[..SLOT_LEN].copy_from_slice(&encode_slot(held, slot, self.slot_bytes, gen));
        self.file.write_all_at(&block, self.header_at(slot))?;
        if let Some(s) = t.slots.get_mut(slot as usize) {
            *s = Slot::At(held);
        }
        Ok(())
    }

    /// Makes every header and zero written so far durable.
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Spare slots ready.
    pub fn spares(&self) -> usize {
        self.lock()
            .slots
            .iter()
            .filter(|s| **s == Slot::At(Held::Spare))
            .count()
    }

    /// Slots that can take a new segment: every slot not holding one (a
    /// spare being zeroed by the refill counts: it will be ready).
    pub fn available(&self) -> usize {
        self.lock()
            .slots
            .iter()
            .filter(|s| !matches!(s, Slot::At(Held::Segment(_))))
            .count()
    }

    /// Takes a slot in state `from` for the caller (lowest first).
    fn take(&self, from: Held) -> Option<u64> {
        let mut t = self.lock();
        let i = t.slots.iter().position(|s| *s == Slot::At(from))?;
        t.slots[i] = Slot::Busy;
        Some(i as u64)
    }

    /// Takes a spare slot, if there is one.
    pub fn take_spare(&self) -> Option<u64> {
        self.take(Held::Spare)
    }

    /// Takes a free slot (to zero), if there is one.
    pub fn take_free(&self) -> Option<u64> {
        self.take(Held::Free)
    }

    /// Gives back a slot taken and not used: it is free (its header was
    /// not changed, so whatever it says, the slot's contents are not
    /// relied on; a spare's header stays true and it stays spare).
    pub fn give_back(&self, slot: u64, was: Held) {
        if let Some(s) = self.lock().slots.get_mut(slot as usize) {
            *s = Slot::At(was);
        }
    }

    /// Makes `len` bytes of `slot`'s data at `off` zeros (not durable
    /// until [`Device::sync`]). A block device is asked to zero the range
    /// itself (`fallocate` with `FALLOC_FL_ZERO_RANGE`, which Linux turns
    /// into the device's write-zeroes command where it has one, so an
    /// NVMe drive need not be sent the zeros); where it refuses, and on a
    /// file standing in for a device, zeros are written. (On a file,
    /// `ZERO_RANGE` would leave unwritten extents, whose first write is a
    /// metadata change, and a slot's pages must overwrite written blocks:
    /// see `flush_once_per_device`.)
    pub fn zero(&self, slot: u64, off: u64, len: u64) -> io::Result<()> {
        if off.checked_add(len).is_none_or(|end| end > self.slot_bytes) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "zeroing {len} bytes at {off} runs past a slot of {} bytes",
                    self.slot_bytes
                ),
            ));
        }
        let at = self.header_at(slot) + HEADER_BYTES + off;
        if self.block {
            use rustix::fs::FallocateFlags as F;
            match rustix::fs::fallocate(&self.file, F::ZERO_RANGE | F::KEEP_SIZE, at, len) {
                Ok(()) => return Ok(()),
                Err(e) if e == rustix::io::Errno::OPNOTSUPP || e == rustix::io::Errno::INVAL => {}
                Err(e) => return Err(e.into()),
            }
        }
        crate::seg_file::write_zeros(&self.file, at, len)
    }

    /// A slot taken and zeroed becomes a spare (durable when this returns).
    pub fn make_spare(&self, slot: u64) -> io::Result<()> {
        self.sync()?;
        self.write_header(slot, Held::Spare)?;
        self.sync()
    }

    /// A taken, zeroed slot now holds segment `seg` (durable after
    /// [`Device::sync`]).
    pub fn assign(&self, slot: u64, seg: u64) -> io::Result<SegFile> {
        self.write_header(slot, Held::Segment(seg))?;
        self.seg_file(slot)
    }

    /// The slot holding segment `seg`.
    pub fn slot_of(&self, seg: u64) -> Option<u64> {
        self.lock()
            .slots
            .iter()
            .position(|s| *s == Slot::At(Held::Segment(seg)))
            .map(|i| i as u64)
    }

    /// Frees slot `slot` (durable after [`Device::sync`]).
    pub fn free(&self, slot: u64) -> io::Result<()> {
        self.write_header(slot, Held::Free)
    }

    /// A zeroed slot for a new segment, and whether its zeros are written
    /// blocks (then pages overwrite them with nothing to allocate, and a
    /// round may write them back and flush once): a spare; else a free
    /// slot zeroed now. On a block device the device zeroes it. A file
    /// standing in for a device is asked for a zero range, which its file
    /// system records as unwritten extents at once instead of the writer
    /// writing `slot_bytes` of zeros while appends wait; its first write
    /// then changes metadata, so such a segment is fsynced each round, as
    /// a segment file made without a spare is. `None` when every slot
    /// holds a segment.
    pub fn zeroed_slot(&self) -> io::Result<Option<(u64, bool)>> {
        if let Some(s) = self.take_spare() {
            return Ok(Some((s, true)));
        }
        let Some(s) = self.take_free() else {
            return Ok(None);
        };
        let at = self.header_at(s) + HEADER_BYTES;
        let r = if self.block {
            self.zero(s, 0, self.slot_bytes).map(|()| true)
        } else {
            use rustix::fs::FallocateFlags as F;
            match rustix::fs::fallocate(
                &self.file,
                F::ZERO_RANGE | F::KEEP_SIZE,
                at,
                self.slot_bytes,
            ) {
                Ok(()) => Ok(false),
                Err(_) => {
                    tracing::warn!(device = %self.path.display(), slot = s, bytes = self.slot_bytes, "no spare slot, and the file system cannot zero a range: writing zeros for a new segment");
                    self.zero(s, 0, self.slot_bytes).map(|()| true)
                }
            }
        };
        match r {
            Ok(written) => Ok(Some((s, written))),
            Err(e) => {
                self.give_back(s, Held::Free);
                Err(e)
            }
        }
    }

    /// Whether this is a block device (its slots are written in place
    /// with nothing to allocate, whatever happened before an open).
    pub fn is_block(&self) -> bool {
        self.block
    }
}

/// How long an open waits for a held device to be let go before refusing
/// it. A killed service's claim can outlive its process for a moment
/// (seen in the kill test: 5 of 30 restarts, each free 20 ms later). Most
/// likely the kernel tearing the dead process's `io_uring` down after the
/// process is reaped: writes still in flight keep the device's file (and
/// with it the `flock` and `O_EXCL` claim) open until they finish. A
/// restart right after a crash must not take that for a second service.
const HELD_WAIT: Duration = Duration::from_secs(5);

/// How often a held device is tried again while waiting.
const HELD_POLL: Duration = Duration::from_millis(20);

/// Opens a device for reading and writing. A block device is opened with
/// `O_EXCL`, which Linux turns into an exclusive claim (it fails while the
/// device is mounted or another process has claimed it); every file is
/// also locked (`flock`), so two services never share one. A held device
/// is tried again for up to `wait` (see [`HELD_WAIT`]) before it is
/// refused.
fn open_exclusive(path: &Path, wait: Duration) -> io::Result<(File, bool)> {
    let start = Instant::now();
    let mut warned = false;
    loop {
        match try_open_exclusive(path) {
            Err(e) if e.kind() == io::ErrorKind::ResourceBusy && start.elapsed() < wait => {
                if !warned {
                    warned = true;
                    tracing::warn!(
                        device = %path.display(),
                        "the device is held; waiting up to {wait:?} in case a stopped service's I/O is still finishing"
                    );
                }
                std::thread::sleep(HELD_POLL);
            }
            Err(e) => return Err(e),
            Ok(opened) => {
                if warned {
                    tracing::warn!(
                        device = %path.display(),
                        waited_ms = start.elapsed().as_millis() as u64,
                        "the device was let go"
                    );
                }
                return Ok(opened);
            }
        }
    }
}

/// One attempt of [`open_exclusive`]: a held device is an error of kind
/// `ResourceBusy`.
fn try_open_exclusive(path: &Path) -> io::Result<(File, bool)> {
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let block = std::fs::metadata(path)?.file_type().is_block_device();
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true);
    if block {
        o.custom_flags(libc::O_EXCL);
    }
    // A refused `O_EXCL` claim (EBUSY) is of kind `ResourceBusy` already;
    // a held lock is `WouldBlock`, made `ResourceBusy` here.
    let file = o.open(path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
        |e| match io::Error::from(e) {
            e if e.kind() == io::ErrorKind::WouldBlock => {
                io::Error::new(io::ErrorKind::ResourceBusy, e.to_string())
            }
            e => e,
        },
    )?;
    Ok((file, block))
}

/// A device's size: a block device's from seeking to its end (its
/// metadata says 0), a file's from its metadata.
fn device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let meta = file.metadata()?;
    if meta.is_file() {
        return Ok(meta.len());
    }
    let mut f = file.try_clone()?;
    f.seek(SeekFrom::End(0))
}

/// The device a flush of `path` covers, for ending a round with one
/// flush per device ([`crate::flush`]), if write-back is sound there: a
/// block device is written in place and flushed by an `fdatasync` of it,
/// so its own number; a file standing in for one only where its file
/// system qualifies.
pub(crate) fn flush_key(path: &Path) -> Option<u64> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    if meta.file_type().is_block_device() {
        // Block device numbers and file system device numbers come from
        // one space, and a file system on this device cannot be mounted
        // while the service holds it.
        return Some(meta.rdev());
    }
    crate::flush::write_back_device(path.parent()?)
}

#[cfg(test)]
mod tests;
