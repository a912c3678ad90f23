//! A submitted request's handle on its results: poll without blocking, wait, or cancel.
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;

use super::request::{CancelFlag, Completion};
use crate::{Error, Result};

enum Slot {
    Waiting(Receiver<Result<Completion>>),
    Done(Completion),
}

/// The pending results of one submission (one input or a batch), in input order.
pub struct Ticket {
    slots: Vec<Slot>,
    cancel: CancelFlag,
    closing: Arc<AtomicBool>,
    batch: bool,
}

impl Ticket {
    pub(crate) fn new(
        receivers: Vec<Receiver<Result<Completion>>>,
        cancel: CancelFlag,
        closing: Arc<AtomicBool>,
        batch: bool,
    ) -> Self {
        Ticket {
            slots: receivers.into_iter().map(Slot::Waiting).collect(),
            cancel,
            closing,
            batch,
        }
    }

    /// True when the submission was a batch (results are a list).
    pub fn is_batch(&self) -> bool {
        self.batch
    }

    /// Asks the engine to stop this submission's jobs; they end with [`Error::Cancelled`].
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Non-blocking: `None` while some input is still running; else every result, or the first
    /// failure (which also cancels the other inputs).
    pub fn poll(&mut self) -> Option<Result<Vec<Completion>>> {
        self.advance(false)
    }

    /// Blocks until every input is done (or one fails).
    pub fn wait(mut self) -> Result<Vec<Completion>> {
        match self.advance(true) {
            Some(r) => r,
            None => Err(Error::Internal("a blocking wait returned early".into())),
        }
    }

    fn advance(&mut self, block: bool) -> Option<Result<Vec<Completion>>> {
        let mut pending = false;
        for index in 0..self.slots.len() {
            let Slot::Waiting(rx) = &self.slots[index] else {
                continue;
            };
            let got = if block {
                rx.recv().map_err(|_| TryRecvError::Disconnected)
            } else {
                rx.try_recv()
            };
            match got {
                Ok(Ok(c)) => self.slots[index] = Slot::Done(c),
                Ok(Err(e)) => return Some(Err(self.fail(index, e))),
                Err(TryRecvError::Empty) => pending = true,
                Err(TryRecvError::Disconnected) => {
                    let e = if self.closing.load(Ordering::SeqCst) {
                        Error::Closed
                    } else {
                        Error::Internal("the engine dropped the request (backend failure)".into())
                    };
                    return Some(Err(self.fail(index, e)));
                }
            }
        }
        if pending {
            return None;
        }
        let done = std::mem::take(&mut self.slots)
            .into_iter()
            .filter_map(|s| match s {
                Slot::Done(c) => Some(c),
                Slot::Waiting(_) => None,
            })
            .collect();
        Some(Ok(done))
    }

    fn fail(&mut self, index: usize, e: Error) -> Error {
        self.cancel.cancel();
        self.slots.clear();
        if self.batch {
            Error::BatchItem {
                index,
                source: Box::new(e),
            }
        } else {
            e
        }
    }
}

impl Drop for Ticket {
    /// An abandoned submission need not run to the end.
    fn drop(&mut self) {
        if !self.slots.is_empty() {
            self.cancel.cancel();
        }
    }
}
