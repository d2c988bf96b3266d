//! What a connection's writer sends: one encoded answer, and for a batched
//! subscription the permit that bounds how many of its answers wait in
//! the connection's queue at once.

use bytes::Bytes;
use tokio::sync::OwnedSemaphorePermit;

/// One encoded answer on its way to the connection's writer.
pub(super) struct Outgoing {
    frame: Bytes,
    /// Released when the writer takes the frame: a batched subscription
    /// needs one to queue an answer, so one whose client reads slowly
    /// waits instead of queueing megabytes of batches.
    permit: Option<OwnedSemaphorePermit>,
}

impl Outgoing {
    /// A frame that holds `permit` until the writer takes it.
    pub(super) fn holding(frame: Bytes, permit: OwnedSemaphorePermit) -> Outgoing {
        Outgoing {
            frame,
            permit: Some(permit),
        }
    }

    /// The frame, for the writer; its permit, if any, is released.
    pub(super) fn take(self) -> Bytes {
        drop(self.permit);
        self.frame
    }
}

impl From<Bytes> for Outgoing {
    fn from(frame: Bytes) -> Outgoing {
        Outgoing {
            frame,
            permit: None,
        }
    }
}
