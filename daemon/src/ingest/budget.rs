//! The bytes of partly received messages, counted across every session
//! and bounded by `max_partial_bytes`.
//!
//! A session holds a message only while it arrives; a peer can declare a
//! large one, send part of it and stop, on as many connections as it may
//! open. Each session's reader charges its [`Charge`] with what it holds
//! of an incomplete message larger than what it carries for free (see
//! `MAX_CARRIED` in `ingest.rs`), and refunds it when the message is
//! complete or the session ends. When a charge would take the total past
//! the limit, the sessions holding the least are closed until it fits:
//! their bytes leave the count at once, and each learns of it through its
//! token, which its reader waits on.
//!
//! Only a message that does not arrive within one read reaches the
//! ledger's lock: the small messages of a busy session never do.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

use crate::Error;

/// The default `max_partial_bytes`.
pub const DEFAULT_MAX_PARTIAL_BYTES: usize = 256 * 1024 * 1024;

/// The limit, and what each session holds against it.
#[derive(Debug)]
pub struct PartialBudget {
    limit: usize,
    ledger: Mutex<Ledger>,
}

#[derive(Debug, Default)]
struct Ledger {
    /// The sum of every holder's bytes.
    used: usize,
    next_id: u64,
    /// By id, which grows with each new holder: of two holding as much,
    /// the newer has the higher id.
    holders: BTreeMap<u64, Holder>,
}

#[derive(Debug)]
struct Holder {
    bytes: usize,
    /// Cancelled when the holder is closed to make room.
    evict: CancellationToken,
}

impl PartialBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            ledger: Mutex::new(Ledger::default()),
        })
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A session's account, holding nothing yet.
    pub fn charge(self: &Arc<Self>) -> Charge {
        Charge {
            budget: self.clone(),
            held: None,
        }
    }

    /// The bytes held across sessions now.
    #[cfg(test)]
    pub(super) fn used(&self) -> usize {
        self.lock().used
    }

    fn lock(&self) -> MutexGuard<'_, Ledger> {
        // The ledger is consistent between statements: a panic while
        // holding it cannot leave it half-changed in a way that matters.
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One session's partly received bytes, as counted in its budget.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<PartialBudget>,
    /// While the session holds bytes: its id, how many, and its token.
    held: Option<(u64, usize, CancellationToken)>,
}

impl Charge {
    /// The bytes this session holds as counted.
    pub fn held(&self) -> usize {
        self.held.as_ref().map_or(0, |(_, bytes, _)| *bytes)
    }

    /// The limit of the budget.
    pub fn limit(&self) -> usize {
        self.budget.limit
    }

    /// Counts `bytes` as what this session now holds. Closes the sessions
    /// that hold the least while the total is over the limit; the error
    /// when this one is among them (now or before: a session told to close
    /// is no longer counted, whatever it reads after).
    pub fn set(&mut self, bytes: usize) -> Result<(), Error> {
        if bytes == self.held() {
            return Ok(());
        }
        let budget = self.budget.clone();
        let mut ledger = budget.lock();
        let id = match &mut self.held {
            Some((id, held, evict)) => {
                if evict.is_cancelled() {
                    let held = *held;
                    self.held = None;
                    return Err(self.over(held));
                }
                let id = *id;
                let holder = ledger.holders.get_mut(&id);
                // Present while not evicted: both change under the lock.
                if let Some(holder) = holder {
                    holder.bytes = bytes;
                }
                ledger.used = ledger.used - *held + bytes;
                *held = bytes;
                if bytes == 0 {
                    ledger.holders.remove(&id);
                    self.held = None;
                    return Ok(());
                }
                id
            }
            None => {
                let id = ledger.next_id;
                ledger.next_id += 1;
                let evict = CancellationToken::new();
                ledger.holders.insert(
                    id,
                    Holder {
                        bytes,
                        evict: evict.clone(),
                    },
                );
                ledger.used += bytes;
                self.held = Some((id, bytes, evict));
                id
            }
        };
        let mut closed_self = false;
        while ledger.used > budget.limit {
            let Some((&victim, _)) = ledger
                .holders
                .iter()
                .min_by_key(|(id, h)| (h.bytes, std::cmp::Reverse(**id)))
            else {
                break;
            };
            if let Some(holder) = ledger.holders.remove(&victim) {
                ledger.used -= holder.bytes;
                holder.evict.cancel();
                closed_self |= victim == id;
            }
        }
        drop(ledger);
        if closed_self {
            self.held = None;
            return Err(self.over(bytes));
        }
        Ok(())
    }

    /// Resolves when this session has been closed to make room; never
    /// while it holds nothing.
    pub async fn evicted(&self) {
        match &self.held {
            Some((_, _, evict)) => evict.cancelled().await,
            None => std::future::pending().await,
        }
    }

    /// The error of a session closed to make room while holding `held`.
    pub fn over(&self, held: usize) -> Error {
        Error::OverPartialBudget {
            held,
            limit: self.budget.limit,
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let Some((id, held, evict)) = self.held.take() else {
            return;
        };
        if evict.is_cancelled() {
            return;
        }
        let mut ledger = self.budget.lock();
        if ledger.holders.remove(&id).is_some() {
            ledger.used -= held;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn charges_add_up_and_refunds_return_them() {
        let budget = PartialBudget::new(100);
        let mut a = budget.charge();
        let mut b = budget.charge();
        a.set(30).unwrap();
        b.set(50).unwrap();
        a.set(40).unwrap();
        assert_eq!(budget.used(), 90);
        a.set(0).unwrap();
        assert_eq!(budget.used(), 50);
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    /// Past the limit, the holders of the least go first, the newest of
    /// equals first, until the total fits; the others keep what they hold.
    #[test]
    fn past_the_limit_those_holding_least_are_closed() {
        let budget = PartialBudget::new(100);
        let mut big = budget.charge();
        let mut small = budget.charge();
        let mut small_newer = budget.charge();
        let mut grower = budget.charge();
        big.set(40).unwrap();
        small.set(10).unwrap();
        small_newer.set(10).unwrap();
        grower.set(30).unwrap();
        // 90 + 15 = 105: one small one (the newer) is enough.
        grower.set(45).unwrap();
        assert!(is_evicted(&small_newer));
        assert!(!is_evicted(&small));
        assert_eq!(budget.used(), 95);
        let err = small_newer.set(20).unwrap_err();
        assert!(
            matches!(
                err,
                Error::OverPartialBudget {
                    held: 10,
                    limit: 100
                }
            ),
            "{err}"
        );
        assert_eq!(budget.used(), 95);
        // The one that grows may be the one holding least: then it goes.
        let mut late = budget.charge();
        let err = late.set(6).unwrap_err();
        assert!(
            matches!(err, Error::OverPartialBudget { held: 6, .. }),
            "{err}"
        );
        assert_eq!(budget.used(), 95);
        drop((small_newer, late));
        assert_eq!(budget.used(), 95);
        drop((big, small, grower));
        assert_eq!(budget.used(), 0);
    }

    fn is_evicted(charge: &Charge) -> bool {
        futures_util::FutureExt::now_or_never(charge.evicted()).is_some()
    }
}
