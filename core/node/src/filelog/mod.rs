//! A durable log in segment files: the embedded database's log.
//!
//! Layout (documented in `docs/embedded.md`): a directory of segment files
//! `<first position, 20 digits>.seg`. Each starts with an 8-byte header
//! (`MLDS`, format version, three zero bytes) followed by records:
//!
//! ```text
//! length u32 LE | crc32 u32 LE of (position ‖ payload) | position u64 LE | payload
//! ```
//!
//! The position inside the checksum makes a record copied to the wrong
//! place detectable. On open every segment is scanned: a record that is
//! incomplete or fails its checksum *at the very end of the last segment*
//! is a torn write of an append that was never acknowledged, and is cut
//! off; anything else that does not verify is corruption of acknowledged
//! data and is reported ([`FileLogError::Corrupt`]), never used.
//!
//! Durability: [`FileLog::sync`] makes every appended record durable
//! (`fdatasync`); [`FileLog::append`] only writes to the OS. The embedded
//! database appends a batch and syncs once (group commit) before it
//! acknowledges any commit of the batch.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use melddb::{Entry, Log, LogError, LogPos};

const MAGIC: &[u8; 4] = b"MLDS";
const VERSION: u8 = 1;
const HEADER: u64 = 8;
const RECORD_HEADER: u64 = 16;
/// Largest record payload accepted (the core's intention limit).
pub const MAX_RECORD: u32 = 64 << 20;
/// Default size after which a new segment file is started.
pub const DEFAULT_SEGMENT_BYTES: u64 = 64 << 20;

/// Errors of the file log.
#[derive(Debug, thiserror::Error)]
pub enum FileLogError {
    /// An operating-system error on a file of the log.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Acknowledged data does not verify: the log is damaged. Nothing after
    /// the damage is used; restore the directory from a copy.
    #[error("log corrupt in {path} at byte {offset}: {why}")]
    Corrupt {
        /// The segment file.
        path: PathBuf,
        /// Byte offset of the bad record.
        offset: u64,
        /// What is wrong.
        why: &'static str,
    },
    /// The entry is larger than a record may be.
    #[error("an entry of {bytes} bytes exceeds the log's record limit of {max} bytes")]
    TooLarge {
        /// The entry's size.
        bytes: u64,
        /// The limit.
        max: u64,
    },
    /// The position was trimmed away (older entries are gone; a checkpoint
    /// stands for them).
    #[error("log position {pos} was trimmed (the log now starts at {first})")]
    Trimmed {
        /// The position asked for.
        pos: LogPos,
        /// The first position the log holds.
        first: LogPos,
    },
    /// The position has not been written yet.
    #[error("log position {pos} is beyond the tail {tail}")]
    NotYetWritten {
        /// The position asked for.
        pos: LogPos,
        /// The next position to be written.
        tail: LogPos,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> FileLogError + '_ {
    move |source| FileLogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What [`FileLog::open`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    /// Records found.
    pub records: u64,
    /// Bytes of a torn, unacknowledged tail that were cut off.
    pub torn_bytes: u64,
}

struct Segment {
    path: PathBuf,
    first: LogPos,
    /// Byte offset of each record, by `pos - first`.
    offsets: Vec<u64>,
    len: u64,
}

/// The segment-file log. Reads are served from the files (through the OS
/// page cache) with an in-memory offset index.
pub struct FileLog {
    dir: PathBuf,
    segments: Vec<Segment>,
    /// The open last segment, for appending.
    writer: File,
    segment_bytes: u64,
    first: LogPos,
    tail: LogPos,
    /// Position up to which everything is durable.
    synced: LogPos,
    /// End of the zero-filled space of the last segment file: appends
    /// below it overwrite written blocks (no size change to journal).
    zeroed: u64,
}

impl std::fmt::Debug for FileLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileLog")
            .field("dir", &self.dir)
            .field("first", &self.first)
            .field("tail", &self.tail)
            .field("segments", &self.segments.len())
            .finish()
    }
}

fn segment_name(first: LogPos) -> String {
    format!("{first:020}.seg")
}

impl FileLog {
    /// Opens (or creates) the log in `dir`, verifying every record and
    /// cutting off a torn tail.
    #[cfg(test)]
    pub fn open(dir: &Path) -> Result<(FileLog, OpenReport), FileLogError> {
        Self::open_with(dir, DEFAULT_SEGMENT_BYTES)
    }

    /// Like [`FileLog::open`] with a custom segment size (tests use small
    /// ones to exercise segment changes).
    pub fn open_with(
        dir: &Path,
        segment_bytes: u64,
    ) -> Result<(FileLog, OpenReport), FileLogError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let segment_bytes = segment_bytes.max(HEADER + RECORD_HEADER + 1);
        let mut names: Vec<(LogPos, PathBuf)> = Vec::new();
        for e in fs::read_dir(dir).map_err(io_err(dir))? {
            let e = e.map_err(io_err(dir))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if let Some(stem) = name.strip_suffix(".seg") {
                if let Ok(first) = stem.parse::<LogPos>() {
                    names.push((first, e.path()));
                }
            }
        }
        names.sort();
        let mut report = OpenReport::default();
        let mut segments = Vec::with_capacity(names.len());
        let count = names.len();
        for (i, (first, path)) in names.into_iter().enumerate() {
            let last = i + 1 == count;
            if let Some(prev) = segments.last() {
                let prev: &Segment = prev;
                if prev.first + prev.offsets.len() as u64 != first {
                    return Err(FileLogError::Corrupt {
                        path,
                        offset: 0,
                        why: "segment does not start where the previous one ends",
                    });
                }
            }
            let seg = scan(&path, first, last, &mut report)?;
            segments.push(seg);
        }
        if segments.is_empty() {
            segments.push(create_segment(dir, 0)?);
        }
        let first = segments[0].first.max(read_trim_point(dir)?);
        let last = segments.last().expect("at least one segment");
        let tail = last.first + last.offsets.len() as u64;
        let writer = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&last.path)
            .map_err(io_err(&last.path))?;
        report.records = tail - first;
        let zeroed = writer.metadata().map_err(io_err(&last.path))?.len();
        Ok((
            FileLog {
                dir: dir.to_path_buf(),
                segments,
                writer,
                segment_bytes,
                first,
                tail,
                synced: tail,
                zeroed,
            },
            report,
        ))
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<(), FileLogError> {
        if self.synced == self.tail {
            return Ok(());
        }
        let path = &self.segments.last().expect("a segment").path;
        self.writer.sync_data().map_err(io_err(path))?;
        self.synced = self.tail;
        Ok(())
    }

    /// A handle for syncing the current segment on another thread (the
    /// caller then reports success with [`FileLog::mark_synced`]); lets a
    /// host overlap the disk flush with other work.
    pub fn sync_handle(&self) -> Result<(File, LogPos, PathBuf), FileLogError> {
        let path = &self.segments.last().expect("a segment").path;
        let f = self.writer.try_clone().map_err(io_err(path))?;
        Ok((f, self.tail, path.clone()))
    }

    /// Records that everything before `pos` was synced through a handle
    /// from [`FileLog::sync_handle`].
    pub fn mark_synced(&mut self, pos: LogPos) {
        self.synced = self.synced.max(pos.min(self.tail));
    }

    /// Position up to which every record is durable.
    pub fn synced(&self) -> LogPos {
        self.synced
    }

    /// Bytes in all segment files.
    pub fn bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.len).sum()
    }

    fn append_record(&mut self, payload: &[u8]) -> Result<LogPos, FileLogError> {
        let need = RECORD_HEADER + payload.len() as u64;
        if self
            .segments
            .last()
            .is_some_and(|s| s.len + need > self.segment_bytes && !s.offsets.is_empty())
        {
            // Start a new segment; the old one is synced first so a crash
            // can only ever tear the last segment.
            self.sync()?;
            let seg = create_segment(&self.dir, self.tail)?;
            self.writer = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&seg.path)
                .map_err(io_err(&seg.path))?;
            self.zeroed = seg.len;
            self.segments.push(seg);
        }
        let pos = self.tail;
        let mut rec = Vec::with_capacity(need as usize);
        rec.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        rec.extend_from_slice(&checksum(pos, payload).to_le_bytes());
        rec.extend_from_slice(&pos.to_le_bytes());
        rec.extend_from_slice(payload);
        let seg = self.segments.last_mut().expect("a segment");
        if seg.len + need > self.zeroed {
            // Zero-fill ahead in chunks: the next sync journals one size
            // change per chunk, and every other sync only flushes data
            // into blocks that are already allocated and written, which
            // is cheaper than a sync that also journals a size change on
            // every append.
            let target = (seg.len + need).max(self.zeroed) + ZERO_CHUNK;
            let zeros = vec![0u8; (target - self.zeroed) as usize];
            std::os::unix::fs::FileExt::write_all_at(&self.writer, &zeros, self.zeroed)
                .map_err(io_err(&seg.path))?;
            self.zeroed = target;
        }
        // Positional: the file is zero-filled ahead, its length is not the end.
        std::os::unix::fs::FileExt::write_all_at(&self.writer, &rec, seg.len)
            .map_err(io_err(&seg.path))?;
        seg.offsets.push(seg.len);
        seg.len += need;
        self.tail += 1;
        Ok(pos)
    }

    /// Calls `f` with every record from `from` to the tail, in order,
    /// reading each segment file once (recovery reads the whole log; one
    /// open and seek per record would double its I/O work). Records are
    /// verified again, since the files may have changed since opening.
    pub fn replay(
        &self,
        from: LogPos,
        mut f: impl FnMut(LogPos, &[u8]),
    ) -> Result<(), FileLogError> {
        let from = from.max(self.first);
        for seg in &self.segments {
            let end = seg.first + seg.offsets.len() as u64;
            if end <= from {
                continue;
            }
            let bytes = fs::read(&seg.path).map_err(io_err(&seg.path))?;
            for pos in from.max(seg.first)..end {
                let off = seg.offsets[(pos - seg.first) as usize];
                let payload = verified(&bytes, off, pos).ok_or_else(|| FileLogError::Corrupt {
                    path: seg.path.clone(),
                    offset: off,
                    why: "record changed on disk since it was verified",
                })?;
                f(pos, payload);
            }
        }
        Ok(())
    }

    /// The segment holding `pos` and the byte range of its record there
    /// (header included), from the index; `None` outside the log.
    fn record_at(&self, pos: LogPos) -> Option<(&Segment, u64, u64)> {
        if pos < self.first || pos >= self.tail {
            return None;
        }
        let i = self
            .segments
            .partition_point(|s| s.first <= pos)
            .checked_sub(1)?;
        let seg = &self.segments[i];
        let k = (pos - seg.first) as usize;
        let off = *seg.offsets.get(k)?;
        let end = seg.offsets.get(k + 1).copied().unwrap_or(seg.len);
        Some((seg, off, end))
    }

    /// Where the payload of the record at `pos` lies: its segment file and
    /// the byte offset of the payload in it (for readers that fetch parts
    /// of a record themselves, like the node cache). `None` outside the log.
    pub fn locate(&self, pos: LogPos) -> Option<(PathBuf, u64)> {
        let (seg, off, _) = self.record_at(pos)?;
        Some((seg.path.clone(), off + RECORD_HEADER))
    }

    /// Payload length of the record at `pos`, from the index (no read).
    pub fn record_len(&self, pos: LogPos) -> Option<u64> {
        let (_, off, end) = self.record_at(pos)?;
        end.checked_sub(off + RECORD_HEADER)
    }

    fn read_record(&self, pos: LogPos) -> Result<Entry, FileLogError> {
        let (seg, off, _) = self.record_at(pos).ok_or_else(|| FileLogError::Corrupt {
            path: self.dir.clone(),
            offset: 0,
            why: "position missing from the segment index",
        })?;
        let mut f = File::open(&seg.path).map_err(io_err(&seg.path))?;
        f.seek(SeekFrom::Start(off)).map_err(io_err(&seg.path))?;
        let mut head = [0u8; RECORD_HEADER as usize];
        f.read_exact(&mut head).map_err(io_err(&seg.path))?;
        let (len, crc, rpos) = header(&head);
        let mut payload = vec![0u8; len as usize];
        f.read_exact(&mut payload).map_err(io_err(&seg.path))?;
        if rpos != pos || checksum(pos, &payload) != crc {
            return Err(FileLogError::Corrupt {
                path: seg.path.clone(),
                offset: off,
                why: "record changed on disk since it was verified",
            });
        }
        Ok(payload.into())
    }
}

/// The payload of the record at byte `off` of a segment, if it is complete
/// and its position and checksum verify.
fn verified(bytes: &[u8], off: u64, pos: LogPos) -> Option<&[u8]> {
    let at = usize::try_from(off).ok()?;
    let head: &[u8; RECORD_HEADER as usize] = bytes
        .get(at..at + RECORD_HEADER as usize)?
        .try_into()
        .ok()?;
    let (len, crc, rpos) = header(head);
    let start = at + RECORD_HEADER as usize;
    let payload = bytes.get(start..start + len as usize)?;
    (rpos == pos && checksum(pos, payload) == crc).then_some(payload)
}

fn header(h: &[u8; RECORD_HEADER as usize]) -> (u32, u32, u64) {
    let mut a = [0u8; 4];
    let mut b = [0u8; 4];
    let mut c = [0u8; 8];
    a.copy_from_slice(&h[0..4]);
    b.copy_from_slice(&h[4..8]);
    c.copy_from_slice(&h[8..16]);
    (
        u32::from_le_bytes(a),
        u32::from_le_bytes(b),
        u64::from_le_bytes(c),
    )
}

fn checksum(pos: LogPos, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&pos.to_le_bytes());
    h.update(payload);
    h.finalize()
}

fn sync_dir(dir: &Path) -> Result<(), FileLogError> {
    // Make a new segment's directory entry durable too.
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

/// How far ahead of the data a segment file is zero-filled.
const ZERO_CHUNK: u64 = 1 << 20;

fn create_segment(dir: &Path, first: LogPos) -> Result<Segment, FileLogError> {
    let path = dir.join(segment_name(first));
    let mut f = OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .map_err(io_err(&path))?;
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&[VERSION, 0, 0, 0]);
    f.write_all(&h).map_err(io_err(&path))?;
    f.sync_all().map_err(io_err(&path))?;
    sync_dir(dir)?;
    Ok(Segment {
        path,
        first,
        offsets: Vec::new(),
        len: HEADER,
    })
}

/// Verifies a segment. In the last segment a bad record with nothing valid
/// after it is a torn tail and is truncated away.
fn scan(
    path: &Path,
    first: LogPos,
    last: bool,
    report: &mut OpenReport,
) -> Result<Segment, FileLogError> {
    let bytes = fs::read(path).map_err(io_err(path))?;
    let corrupt = |offset: u64, why| FileLogError::Corrupt {
        path: path.to_path_buf(),
        offset,
        why,
    };
    let head_len = bytes.len().min(HEADER as usize);
    if bytes.len() < HEADER as usize || bytes[..head_len].iter().all(|b| *b == 0) {
        if last
            && (bytes[..head_len].iter().all(|b| *b == 0)
                || MAGIC.starts_with(&bytes[..bytes.len().min(4)]))
        {
            // Created but its header never reached the disk: rewrite it.
            fs::remove_file(path).map_err(io_err(path))?;
            report.torn_bytes += bytes.len() as u64;
            let dir = path.parent().unwrap_or(Path::new("."));
            return create_segment(dir, first);
        }
        return Err(corrupt(0, "segment header truncated"));
    }
    if &bytes[..4] != MAGIC || bytes[4] != VERSION {
        return Err(corrupt(0, "not a MeldDB log segment of a known version"));
    }
    // Segments are zero-filled ahead of the data: the data ends after the last
    // non-zero byte (a record header is never all zeros: its checksum
    // covers the position).
    let data_end = bytes.iter().rposition(|b| *b != 0).map_or(0, |i| i + 1);
    let mut offsets = Vec::new();
    let mut at = HEADER as usize;
    let mut pos = first;
    while at < data_end {
        let mut bad = |why| -> Result<Segment, FileLogError> {
            if last && !valid_record_after(&bytes, at + 1) {
                // A torn write at the end: never acknowledged. Zero it, so
                // the preallocated file keeps its size and later appends
                // overwrite clean space.
                let f = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(io_err(path))?;
                let zeros = vec![0u8; data_end - at];
                std::os::unix::fs::FileExt::write_all_at(&f, &zeros, at as u64)
                    .map_err(io_err(path))?;
                f.sync_all().map_err(io_err(path))?;
                report.torn_bytes += (data_end - at) as u64;
                Ok(Segment {
                    path: path.to_path_buf(),
                    first,
                    offsets: offsets.clone(),
                    len: at as u64,
                })
            } else {
                Err(corrupt(at as u64, why))
            }
        };
        let Some(head) = bytes.get(at..at + RECORD_HEADER as usize) else {
            return bad("record header truncated");
        };
        let mut h = [0u8; RECORD_HEADER as usize];
        h.copy_from_slice(head);
        let (len, crc, rpos) = header(&h);
        if len > MAX_RECORD {
            return bad("record length beyond the limit");
        }
        let end = at + RECORD_HEADER as usize + len as usize;
        let Some(payload) = bytes.get(at + RECORD_HEADER as usize..end) else {
            return bad("record payload truncated");
        };
        if rpos != pos || checksum(pos, payload) != crc {
            return bad("record checksum or position mismatch");
        }
        offsets.push(at as u64);
        at = end;
        pos += 1;
    }
    Ok(Segment {
        path: path.to_path_buf(),
        first,
        offsets,
        len: at as u64,
    })
}

/// Whether a complete, verifying record starts anywhere at or after `from`
/// (then the damage is not a torn tail but corruption in the middle).
fn valid_record_after(bytes: &[u8], from: usize) -> bool {
    let mut at = from;
    while at + RECORD_HEADER as usize <= bytes.len() {
        let mut h = [0u8; RECORD_HEADER as usize];
        h.copy_from_slice(&bytes[at..at + RECORD_HEADER as usize]);
        let (len, crc, rpos) = header(&h);
        let end = at + RECORD_HEADER as usize + len as usize;
        if len > 0
            && len <= MAX_RECORD
            && end <= bytes.len()
            && checksum(rpos, &bytes[at + 16..end]) == crc
        {
            return true;
        }
        at += 1;
    }
    false
}

impl FileLog {
    /// Appends one entry and returns its position (not durable until
    /// [`FileLog::sync`]).
    pub fn append(&mut self, entry: &[u8]) -> Result<LogPos, FileLogError> {
        if entry.len() as u64 > MAX_RECORD as u64 {
            return Err(FileLogError::TooLarge {
                bytes: entry.len() as u64,
                max: MAX_RECORD as u64,
            });
        }
        self.append_record(entry)
    }

    /// Reads the entry at `pos`.
    pub fn read(&self, pos: LogPos) -> Result<Entry, FileLogError> {
        if pos < self.first {
            return Err(FileLogError::Trimmed {
                pos,
                first: self.first,
            });
        }
        if pos >= self.tail {
            return Err(FileLogError::NotYetWritten {
                pos,
                tail: self.tail,
            });
        }
        self.read_record(pos)
    }

    /// Drops whole segments that end before `pos` (a segment holding any
    /// position at or after `pos` is kept, so `first` may stay below `pos`).
    pub fn trim(&mut self, pos: LogPos) -> Result<(), FileLogError> {
        if pos > self.tail {
            return Err(FileLogError::NotYetWritten {
                pos,
                tail: self.tail,
            });
        }
        // The trim point first, then the files: a crash in between leaves
        // files that are simply unreadable below the point. The other way
        // round, a crash could leave the log starting at a segment boundary
        // the caller never asked for (recovery would then look for a
        // checkpoint where there is none).
        if pos > self.first {
            write_trim_point(&self.dir, pos)?;
        }
        while self.segments.len() > 1 {
            let s = &self.segments[0];
            let end = s.first + s.offsets.len() as u64;
            if end > pos {
                break;
            }
            fs::remove_file(&s.path).map_err(io_err(&s.path))?;
            self.segments.remove(0);
        }
        self.first = pos.max(self.first);
        Ok(())
    }
}

/// The engine's view of the file log's errors.
fn to_log_error(e: FileLogError) -> LogError {
    match e {
        FileLogError::Trimmed { pos, first } => LogError::Trimmed { pos, first },
        FileLogError::NotYetWritten { pos, tail } => LogError::NotYetWritten { pos, tail },
        e => LogError::Backend(e.to_string()),
    }
}

impl Log for FileLog {
    fn append(&mut self, entry: &[u8]) -> Result<LogPos, LogError> {
        FileLog::append(self, entry).map_err(to_log_error)
    }

    fn read(&self, pos: LogPos) -> Result<Entry, LogError> {
        FileLog::read(self, pos).map_err(to_log_error)
    }

    fn tail(&self) -> LogPos {
        self.tail
    }

    fn first(&self) -> LogPos {
        self.first
    }

    fn trim(&mut self, pos: LogPos) -> Result<(), LogError> {
        if pos > self.tail {
            return Err(LogError::TrimBeyondTail {
                pos,
                tail: self.tail,
            });
        }
        FileLog::trim(self, pos).map_err(to_log_error)
    }
}

const TRIM_FILE: &str = "trimmed-below";

fn read_trim_point(dir: &Path) -> Result<LogPos, FileLogError> {
    let path = dir.join(TRIM_FILE);
    match fs::read_to_string(&path) {
        Ok(s) => s.trim().parse().map_err(|_| FileLogError::Corrupt {
            path,
            offset: 0,
            why: "trim point is not a number",
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
        Err(e) => Err(FileLogError::Io { path, source: e }),
    }
}

fn write_trim_point(dir: &Path, pos: LogPos) -> Result<(), FileLogError> {
    // Write-then-rename, so a crash leaves the old or the new point.
    let tmp = dir.join(format!("{TRIM_FILE}.tmp"));
    let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(pos.to_string().as_bytes())
        .map_err(io_err(&tmp))?;
    f.sync_all().map_err(io_err(&tmp))?;
    fs::rename(&tmp, dir.join(TRIM_FILE)).map_err(io_err(dir))?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests;
