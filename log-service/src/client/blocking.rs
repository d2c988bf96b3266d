//! [`BlockingLog`]: one log of the service as the core's [`melddb::Log`].

use std::sync::Arc;

use bytes::Bytes;
use melddb::{Entry, LogError, LogPos};

use super::{Client, ClientError, ClientOptions};
use crate::locks::lock;
use crate::protocol::Code;

/// One log of the service as a [`melddb::Log`], for synchronous callers
/// (the core's database and tests). It owns a small Tokio runtime.
pub struct BlockingLog {
    rt: tokio::runtime::Runtime,
    client: Client,
    log: String,
    bounds: std::sync::Mutex<(u64, u64)>,
}

impl BlockingLog {
    /// Connects to `addr` and uses log `log`.
    pub fn connect(addr: &str, log: &str, opts: ClientOptions) -> Result<BlockingLog, ClientError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError::Connect {
                addr: addr.into(),
                why: e.to_string(),
            })?;
        let client = rt.block_on(Client::connect_with(addr, opts))?;
        let bounds = rt.block_on(client.bounds(log))?;
        Ok(BlockingLog {
            rt,
            client,
            log: log.to_string(),
            bounds: std::sync::Mutex::new(bounds),
        })
    }

    /// Asks the service for the bounds (other writers' appends included).
    pub fn refresh(&self) -> Result<(u64, u64), ClientError> {
        let b = self.rt.block_on(self.client.bounds(&self.log))?;
        *lock(&self.bounds) = b;
        Ok(b)
    }

    /// The records at `from`, `from + 1`, ... in one request: at most
    /// `max_records` of them and `max_bytes` bytes, but at least one when
    /// `from` is below the tail (see [`Client::read_range`]); none at the
    /// tail. Errors are the [`melddb::Log::read`] ones.
    pub fn read_range(
        &self,
        from: LogPos,
        max_records: u32,
        max_bytes: u32,
    ) -> Result<Vec<Entry>, LogError> {
        let (_, records) = self
            .rt
            .block_on(
                self.client
                    .read_range(&self.log, from, max_records, max_bytes),
            )
            .map_err(to_log_error)?;
        Ok(records.iter().map(|b| Arc::from(&b[..])).collect())
    }

    fn cached(&self) -> (u64, u64) {
        *lock(&self.bounds)
    }
}

fn to_log_error(e: ClientError) -> LogError {
    match e {
        ClientError::Server {
            code: Code::NotYetWritten,
            a,
            b,
            ..
        } => LogError::NotYetWritten { pos: a, tail: b },
        ClientError::Server {
            code: Code::Trimmed,
            a,
            b,
            ..
        } => LogError::Trimmed { pos: a, first: b },
        ClientError::Server {
            code: Code::TrimBeyondTail,
            a,
            b,
            ..
        } => LogError::TrimBeyondTail { pos: a, tail: b },
        ClientError::Server {
            code: Code::TooLarge,
            a,
            b,
            ..
        } => LogError::EntryTooLarge {
            len: a as usize,
            limit: b as usize,
        },
        // Sizes of the whole frame: the entry plus a header of a few dozen
        // bytes.
        ClientError::TooLarge { bytes, limit } => LogError::EntryTooLarge { len: bytes, limit },
        other => LogError::Backend(other.to_string()),
    }
}

impl melddb::Log for BlockingLog {
    fn append(&mut self, entry: &[u8]) -> Result<LogPos, LogError> {
        let pos = self
            .rt
            .block_on(self.client.append(&self.log, Bytes::copy_from_slice(entry)))
            .map_err(to_log_error)?;
        let mut b = lock(&self.bounds);
        b.1 = b.1.max(pos + 1);
        Ok(pos)
    }

    fn read(&self, pos: LogPos) -> Result<Entry, LogError> {
        let b = self
            .rt
            .block_on(self.client.read(&self.log, pos))
            .map_err(to_log_error)?;
        Ok(Arc::from(&b[..]))
    }

    /// Asks the service; if it cannot be reached (the trait cannot fail
    /// here) the last known tail is returned and the next read reports the
    /// error.
    fn tail(&self) -> LogPos {
        self.refresh().unwrap_or_else(|_| self.cached()).1
    }

    fn first(&self) -> LogPos {
        self.refresh().unwrap_or_else(|_| self.cached()).0
    }

    fn trim(&mut self, pos: LogPos) -> Result<(), LogError> {
        self.rt
            .block_on(self.client.trim(&self.log, pos))
            .map_err(to_log_error)?;
        let mut b = lock(&self.bounds);
        b.0 = b.0.max(pos);
        Ok(())
    }
}
