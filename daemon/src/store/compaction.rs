//! Compaction in a write transaction: deleting a stream's oldest frames,
//! as many as the caller accepts one by one. The chunks wholly below the
//! new first frame go; the one holding it is rewritten to start with it.

use redb::ReadableTable;

use super::chunk::{
    chunk_from, chunk_holding, corrupt_chunk, own_chunk_bytes, stored_count, ChunkIter,
};
use super::storage;
use super::txn::WriteTxn;
use crate::wal::{Op, RawBytes};
use crate::Result;

/// What [`WriteTxn::delete_prefix`] shows its caller about each frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameInfo {
    pub seq: u64,
    pub ts_micros: u64,
    pub payload_len: u64,
}

/// The result of [`WriteTxn::delete_prefix`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deleted {
    pub frames: u64,
    pub bytes: u64,
    /// The first frame that was looked at and kept, if any.
    pub first_kept: Option<FrameInfo>,
}

impl WriteTxn<'_> {
    /// Deletes frames of a stream from `from_seq` on, in seq order, while
    /// `delete` says yes, looking at no frame beyond `through_seq`. Only a
    /// prefix is ever deleted: the first frame `delete` refuses ends the run.
    /// `from_seq` must be the stream's first retained seq.
    pub fn delete_prefix(
        &mut self,
        stream_id: u64,
        from_seq: u64,
        through_seq: u64,
        delete: impl FnMut(FrameInfo) -> bool,
    ) -> Result<Deleted> {
        self.store_chunks(None)?;
        let out = self.choose_prefix(stream_id, from_seq, through_seq, delete)?;
        if out.frames > 0 {
            self.cut_chunks(stream_id, from_seq + out.frames)?;
        }
        Ok(out)
    }

    /// Shows `delete` the frames from `from_seq` through `through_seq` until
    /// it refuses one; deletes nothing.
    fn choose_prefix(
        &mut self,
        stream_id: u64,
        from_seq: u64,
        through_seq: u64,
        mut delete: impl FnMut(FrameInfo) -> bool,
    ) -> Result<Deleted> {
        let mut out = Deleted::default();
        let Some(start) =
            chunk_holding(self.chunks.get()?, stream_id, from_seq).map_err(storage)?
        else {
            return Ok(out);
        };
        let range = self
            .chunks
            .get()?
            .range((stream_id, start)..=(stream_id, through_seq))
            .map_err(storage)?;
        let mut kept = Vec::new();
        for item in range {
            let (key, value) = item.map_err(storage)?;
            let (_, first) = key.value();
            let corrupt = |e: &postcard::Error| corrupt_chunk(stream_id, first, e);
            let bytes = own_chunk_bytes(value.value(), self.log, &mut kept, stream_id, first)?;
            for f in ChunkIter::new(first, bytes).map_err(|e| corrupt(&e))? {
                let f = f.map_err(|e| corrupt(&e))?;
                if f.seq < from_seq {
                    continue;
                }
                if f.seq > through_seq {
                    return Ok(out);
                }
                let info = FrameInfo {
                    seq: f.seq,
                    ts_micros: f.ts_micros,
                    payload_len: f.payload.len() as u64,
                };
                if !delete(info) {
                    out.first_kept = Some(info);
                    return Ok(out);
                }
                out.frames += 1;
                out.bytes += info.payload_len;
            }
        }
        Ok(out)
    }

    /// Makes `new_first` the stream's first stored seq: deletes the chunks
    /// wholly below it and rewrites the one holding it to start with it.
    fn cut_chunks(&mut self, stream_id: u64, new_first: u64) -> Result<()> {
        let mut straddling = None;
        let mut failure = None;
        self.chunks
            .get()?
            .retain_in(
                (stream_id, 0)..(stream_id, new_first),
                |(_, first), value| {
                    match stored_count(value) {
                        Ok(n) if first + u64::from(n) > new_first => {
                            straddling = Some((first, value.to_vec()));
                        }
                        Ok(_) => {}
                        Err(e) => failure = Some(corrupt_chunk(stream_id, first, &e)),
                    }
                    failure.is_some()
                },
            )
            .map_err(storage)?;
        if let Some(e) = failure {
            return Err(e);
        }
        self.log(&Op::RemoveChunksBelow {
            stream_id,
            below: new_first,
        })?;
        if let Some((first, value)) = straddling {
            let mut kept = Vec::new();
            let bytes = own_chunk_bytes(&value, self.log, &mut kept, stream_id, first)?;
            let rest = chunk_from(first, bytes, new_first)
                .map_err(|e| corrupt_chunk(stream_id, first, &e))?;
            self.take_room(rest.len())?;
            self.chunks
                .get()?
                .insert((stream_id, new_first), rest.as_slice())
                .map_err(storage)?;
            self.log(&Op::Chunk {
                stream_id,
                first_seq: new_first,
                chunk: RawBytes(&rest),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use crate::store::tests::{
        crash_copy, frame, logged_frames, put, put_frames, store, stored_ts, ts_of_only,
        where_chunks_are, SMALL_LOG,
    };
    use crate::store::Store;
    use crate::syncer::Durable;

    #[test]
    fn compaction_deletes_whole_chunks_and_rewrites_a_straddling_one() {
        let (_dir, store) = store();
        put(&store, 1, 4);
        put(&store, 5, 8);
        let deleted = store
            .write(|txn| txn.delete_prefix(7, 1, 8, |info| info.seq < 6))
            .unwrap();
        assert_eq!(deleted.frames, 5);
        assert_eq!(deleted.first_kept.map(|i| i.seq), Some(6));
        for seq in 1..=5 {
            assert_eq!(store.frame_ts(7, seq).unwrap(), None, "seq {seq}");
        }
        assert_eq!(store.frame_ts(7, 6).unwrap(), Some(6));
        assert_eq!(store.frame_ts(7, 8).unwrap(), Some(8));
        assert_eq!(store.frame_ts(7, 9).unwrap(), None);
        // The next compaction starts at the rewritten chunk's first frame.
        let deleted = store
            .write(|txn| txn.delete_prefix(7, 6, 8, |_| true))
            .unwrap();
        assert_eq!(deleted.frames, 3);
        assert_eq!(store.frame_ts(7, 8).unwrap(), None);
    }

    #[test]
    fn compaction_cuts_a_chunk_the_log_keeps() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open_with_log(&dir.path().join("t.redb"), SMALL_LOG).unwrap();
        logged_frames(&store, 1, 10);
        assert_eq!(where_chunks_are(&store), (1, 0));
        let (deleted, _) = store
            .write_logged(
                |txn| txn.delete_prefix(7, 1, 10, |info| info.seq < 4),
                |_| {},
            )
            .unwrap();
        assert_eq!(deleted.frames, 3);
        // The rest was rewritten into the store, starting at seq 4.
        assert_eq!(where_chunks_are(&store), (0, 1));
        let ts: Vec<Option<u64>> = (1..=10)
            .map(|seq| store.frame_ts(7, seq).unwrap())
            .collect();
        assert_eq!(ts, ts_of_only(4..=10));
    }

    #[test]
    fn frames_put_and_deleted_in_one_transaction() {
        let (_dir, store) = store();
        let deleted = store
            .write(|txn| {
                for seq in 1..=3 {
                    txn.put_frame(7, seq, &frame(b"x"))?;
                }
                txn.delete_prefix(7, 1, 3, |info| info.seq == 1)
            })
            .unwrap();
        assert_eq!(deleted.frames, 1);
        assert_eq!(store.frame_ts(7, 1).unwrap(), None);
        assert!(store.frame_ts(7, 2).unwrap().is_some());
    }

    #[test]
    fn a_logged_transaction_deleting_frames_it_put_replays_alike() {
        // Its chunks go into redb only after the record is appended: the
        // deletion must still see them, in the record's order.
        let (dir, store) = store();
        let path = dir.path().join("t.redb");
        let (deleted, durable) = store
            .write_logged(
                |txn| {
                    put_frames(txn, 1, 3)?;
                    txn.delete_prefix(7, 1, 3, |info| info.seq == 1)
                },
                |_| {},
            )
            .unwrap();
        assert_eq!(
            (deleted.frames, matches!(durable, Durable::Logged(_))),
            (1, true)
        );
        assert_eq!(stored_ts(&store, 1, 10), ts_of_only(2..=3));
        let crashed = tempfile::tempdir().unwrap();
        let recovered = Store::open(&crash_copy(&path, crashed.path(), true)).unwrap();
        assert_eq!(stored_ts(&recovered, 1, 10), ts_of_only(2..=3));
    }

    #[test]
    fn delete_prefix_stops_at_the_first_kept_frame() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("t.redb")).unwrap();
        store
            .write(|txn| {
                for seq in 1..=10 {
                    txn.put_frame(7, seq, &frame(b"abc"))?;
                }
                Ok(())
            })
            .unwrap();
        let deleted = store
            .write(|txn| txn.delete_prefix(7, 1, 10, |info| info.seq != 4 && info.seq < 8))
            .unwrap();
        assert_eq!(deleted.frames, 3);
        assert_eq!(deleted.bytes, 9);
        assert_eq!(deleted.first_kept.map(|i| i.seq), Some(4));
        assert_eq!(store.frame_ts(7, 3).unwrap(), None);
        assert!(store.frame_ts(7, 4).unwrap().is_some());
        assert!(store.frame_ts(7, 9).unwrap().is_some());
    }
}
