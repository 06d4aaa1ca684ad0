//! The writer's cache of the committed state, loaded from a snapshot of
//! the store.
//!
//! The writer keeps every stream's metadata, producers' dedupe state and
//! consumers' acks in memory, so an append needs no read. When a commit
//! fails, every command of that batch gets the error and the writer reloads
//! those caches from the store, so nothing half-applied lingers.

use std::collections::{BTreeMap, HashMap};

use super::apply::Staged;
use super::writer::Writer;
use crate::store::{ProducerState, Snapshot, StreamMeta};
use crate::syncer::Durable;

/// The writer's cache of the committed state.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) next_stream_id: u64,
    pub(super) streams: HashMap<String, StreamState>,
    /// The last seq of each removed stream, which a stream created again
    /// under its name starts above.
    pub(super) tombstones: HashMap<String, u64>,
}

#[derive(Debug)]
pub(super) struct StreamState {
    pub(super) meta: StreamMeta,
    pub(super) producers: HashMap<String, ProducerState>,
    pub(super) consumers: BTreeMap<String, u64>,
    /// Timestamp of the first retained frame; `None` when unknown or when
    /// nothing is retained.
    pub(super) oldest_ts: Option<u64>,
}

impl State {
    fn from_snapshot(snapshot: Snapshot) -> Self {
        let mut streams: HashMap<String, StreamState> = HashMap::new();
        let mut names = HashMap::new();
        for (name, meta) in snapshot.streams {
            names.insert(meta.id, name.clone());
            streams.insert(
                name,
                StreamState {
                    meta,
                    producers: HashMap::new(),
                    consumers: BTreeMap::new(),
                    oldest_ts: None,
                },
            );
        }
        for (id, producer, state) in snapshot.producers {
            if let Some(s) = names.get(&id).and_then(|n| streams.get_mut(n)) {
                s.producers.insert(producer, state);
            }
        }
        for (id, consumer, acked) in snapshot.consumers {
            if let Some(s) = names.get(&id).and_then(|n| streams.get_mut(n)) {
                s.consumers.insert(consumer, acked);
            }
        }
        Self {
            next_stream_id: snapshot.next_stream_id.max(1),
            streams,
            tombstones: snapshot.tombstones.into_iter().collect(),
        }
    }
}

impl Writer {
    /// Replaces the caches with `snapshot` and tells the hub.
    pub(super) fn install(&mut self, snapshot: Snapshot) {
        self.state = State::from_snapshot(snapshot);
        let ranges: Vec<(String, u64, u64)> = self
            .state
            .streams
            .iter()
            .map(|(name, s)| (name.clone(), s.meta.first_seq, s.meta.last_seq))
            .collect();
        let hub = self.hub.clone();
        // In line after the commits before it, which it supersedes.
        self.syncer
            .after(Durable::Nothing, Box::new(move |_| hub.reset(ranges)));
        // Compaction may have been behind the acks when the state was last
        // saved: look at every stream once.
        let names: Vec<String> = self.state.streams.keys().cloned().collect();
        for name in names {
            self.mark_dirty(&name);
        }
    }

    pub(super) fn stream_or_create(
        &mut self,
        name: &str,
        ts: u64,
        staged: &mut Staged,
    ) -> &mut StreamState {
        // Looked up before any `entry`, which would copy the name for
        // every frame.
        if !self.state.streams.contains_key(name) {
            let id = self.state.next_stream_id;
            self.state.next_stream_id += 1;
            staged.created_stream = true;
            let after = self.state.tombstones.get(name).copied().unwrap_or(0);
            let created = StreamState {
                meta: StreamMeta::after(id, ts, after),
                producers: HashMap::new(),
                consumers: BTreeMap::new(),
                oldest_ts: None,
            };
            self.state.streams.insert(name.to_owned(), created);
        }
        self.state
            .streams
            .get_mut(name)
            .unwrap_or_else(|| unreachable!("the stream was just inserted"))
    }

    /// The stream's last seq as this batch has it so far (0 for none).
    pub(super) fn last_seq(&self, stream: &str) -> u64 {
        self.state
            .streams
            .get(stream)
            .map_or(0, |s| s.meta.last_seq)
    }
}
