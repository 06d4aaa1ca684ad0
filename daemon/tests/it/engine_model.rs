//! The queue against a model: random append batches from several producers
//! (resends included), consumer opens and acks, compaction and reopening
//! from disk, checked step by step against a `BTreeMap` of what must be
//! stored.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use proptest::prelude::*;
use tether_protocol::{Append, FrameKind, Gap};
use tetherd::config::Retention;
use tetherd::engine::{Queue, QueueOptions};
use tetherd::subscription::SubEvent;
use tetherd::Error;

const STREAMS: [&str; 3] = ["alpha", "beta", "gamma"];
const PRODUCERS: [&str; 3] = ["p0", "p1", "p2"];
const CONSUMERS: [&str; 2] = ["c0", "c1"];

/// How one generated append picks its producer_seq.
#[derive(Clone, Debug)]
enum Pseq {
    /// Past the producer's newest by 1 + n (gaps are allowed).
    Next(u8),
    /// A resend of the producer's newest minus n (a duplicate).
    Resend(u8),
}

#[derive(Clone, Debug)]
enum Op {
    Append(Vec<(usize, usize, Pseq)>),
    OpenConsumer(usize, usize),
    /// Ack through `last_seq * permille / 1000`; above 1000 goes beyond the
    /// last seq and must be refused.
    Ack(usize, usize, u16),
    Compact,
    Reopen,
    /// Read from `last_seq * permille / 1000` to the end.
    Read(usize, u16),
}

fn op() -> impl Strategy<Value = Op> {
    let pseq = prop_oneof![
        4 => (0u8..3).prop_map(Pseq::Next),
        1 => (0u8..4).prop_map(Pseq::Resend),
    ];
    let append = (0..STREAMS.len(), 0..PRODUCERS.len(), pseq);
    prop_oneof![
        6 => prop::collection::vec(append, 1..12).prop_map(Op::Append),
        1 => (0..STREAMS.len(), 0..CONSUMERS.len()).prop_map(|(s, c)| Op::OpenConsumer(s, c)),
        3 => (0..STREAMS.len(), 0..CONSUMERS.len(), 0u16..1100).prop_map(|(s, c, p)| Op::Ack(s, c, p)),
        2 => Just(Op::Compact),
        1 => Just(Op::Reopen),
        2 => (0..STREAMS.len(), 0u16..1000).prop_map(|(s, p)| Op::Read(s, p)),
    ]
}

/// What the model knows about one stream.
#[derive(Debug, Default)]
struct ModelStream {
    /// Retained frames by seq: (producer, producer_seq).
    frames: BTreeMap<u64, (usize, u64)>,
    last_seq: u64,
    /// Frames through this seq may have been deleted by background
    /// compaction; the ones above must be there.
    deletable_through: u64,
    /// (newest producer_seq, its seq) per producer.
    producers: BTreeMap<usize, (u64, u64)>,
    consumers: BTreeMap<usize, u64>,
    /// The first seq last seen in `stream_range`.
    range_first: u64,
}

impl ModelStream {
    /// The first seq the model is sure is retained-or-unknown: below it
    /// everything is gone.
    fn first_seq(&self) -> u64 {
        self.frames
            .keys()
            .next()
            .copied()
            .unwrap_or(self.last_seq + 1)
    }

    /// What the queue may delete now: through the lowest ack (when there
    /// are consumers) or beyond the retained frame count.
    fn current_bound(&self, max_frames: Option<u64>) -> u64 {
        let acked = self.consumers.values().copied().min().unwrap_or(0);
        let over = max_frames.map_or(0, |m| self.last_seq.saturating_sub(m));
        acked.max(over)
    }

    /// Raises the deletion bound from the current acks and retention.
    fn update_bound(&mut self, max_frames: Option<u64>) {
        self.deletable_through = self.deletable_through.max(self.current_bound(max_frames));
    }

    /// Forgets the frames below `first` (the queue says they are gone).
    fn drop_below(&mut self, first: u64) {
        assert!(
            first <= self.deletable_through + 1,
            "frames up to {} were deleted, but only {} were deletable",
            first - 1,
            self.deletable_through
        );
        self.frames = self.frames.split_off(&first);
    }
}

fn payload(stream: usize, producer: usize, pseq: u64) -> Bytes {
    Bytes::from(format!(
        "{}/{}/{pseq}",
        STREAMS[stream], PRODUCERS[producer]
    ))
}

struct Harness {
    queue: Option<Queue>,
    model: Vec<ModelStream>,
    max_frames: Option<u64>,
}

impl Harness {
    fn queue(&self) -> &Queue {
        self.queue.as_ref().unwrap()
    }

    async fn run(&mut self, op: Op, path: &Path, opts: &QueueOptions) {
        match op {
            Op::Append(batch) => self.append(batch).await,
            Op::OpenConsumer(s, c) => self.open_consumer(s, c).await,
            Op::Ack(s, c, permille) => self.ack(s, c, permille).await,
            Op::Compact => {
                self.queue().compact().await.unwrap();
                let queue = self.queue.as_ref().unwrap();
                for (i, m) in self.model.iter_mut().enumerate() {
                    m.update_bound(self.max_frames);
                    if m.last_seq == 0 {
                        continue;
                    }
                    // After an explicit compaction everything deletable is gone.
                    let (first, last) = queue.stream_range(STREAMS[i]).unwrap();
                    assert_eq!(first, m.deletable_through.max(m.first_seq() - 1) + 1);
                    assert_eq!(last, m.last_seq);
                    m.drop_below(first);
                }
            }
            Op::Reopen => {
                self.queue.take().unwrap().close().await.unwrap();
                self.queue = Some(Queue::open(path, opts.clone()).unwrap());
            }
            Op::Read(s, permille) => self.read(s, permille).await,
        }
        self.check_ranges();
    }

    async fn append(&mut self, batch: Vec<(usize, usize, Pseq)>) {
        // The model's view of each producer's newest, advanced as the batch
        // is generated so that resends inside the batch are resends too.
        let mut newest: BTreeMap<(usize, usize), u64> = BTreeMap::new();
        let mut appends = Vec::new();
        for (s, p, how) in batch {
            let current = *newest
                .entry((s, p))
                .or_insert_with(|| self.model[s].producers.get(&p).map_or(0, |x| x.0));
            let pseq = match how {
                Pseq::Resend(back) if current > 0 => current.saturating_sub(u64::from(back)).max(1),
                Pseq::Next(gap) | Pseq::Resend(gap) => current + 1 + u64::from(gap),
            };
            newest.insert((s, p), current.max(pseq));
            appends.push(Append {
                stream: STREAMS[s].into(),
                producer: PRODUCERS[p].into(),
                producer_seq: pseq,
                kind: FrameKind::Data,
                payload: payload(s, p, pseq),
            });
        }
        let outcomes = self.queue().append(appends.clone()).await.unwrap();
        assert_eq!(outcomes.len(), appends.len());
        for (a, out) in appends.iter().zip(outcomes) {
            let s = STREAMS.iter().position(|n| *n == a.stream).unwrap();
            let p = PRODUCERS.iter().position(|n| *n == a.producer).unwrap();
            let m = &mut self.model[s];
            match m.producers.get(&p).copied() {
                Some((newest, seq)) if a.producer_seq <= newest => {
                    assert!(
                        out.duplicate,
                        "resend {a:?} was stored again as {}",
                        out.seq
                    );
                    assert_eq!(out.seq, seq);
                }
                _ => {
                    assert!(!out.duplicate, "new append {a:?} taken for a duplicate");
                    m.last_seq += 1;
                    assert_eq!(out.seq, m.last_seq, "seqs are contiguous");
                    m.frames.insert(out.seq, (p, a.producer_seq));
                    m.producers.insert(p, (a.producer_seq, out.seq));
                }
            }
            assert_eq!(out.producer_seq, a.producer_seq);
        }
        for m in &mut self.model {
            m.update_bound(self.max_frames);
        }
    }

    async fn open_consumer(&mut self, s: usize, c: usize) {
        let result = self.queue().open_consumer(STREAMS[s], CONSUMERS[c]).await;
        let m = &mut self.model[s];
        if m.last_seq == 0 {
            assert!(
                matches!(result, Err(Error::StreamNotFound(_))),
                "{result:?}"
            );
            return;
        }
        let acked = result.unwrap();
        match m.consumers.get(&c) {
            Some(&known) => assert_eq!(acked, known),
            None => {
                // A new consumer starts before the first retained frame.
                m.drop_below(acked + 1);
                m.consumers.insert(c, acked);
                // Its ack may hold back deletions that were allowed before.
                m.deletable_through = m.current_bound(self.max_frames).max(acked);
            }
        }
    }

    async fn ack(&mut self, s: usize, c: usize, permille: u16) {
        if self.model[s].last_seq > 0 && !self.model[s].consumers.contains_key(&c) {
            // An ack creates an unknown consumer without saying where the
            // stream starts; opening it first keeps the model exact.
            self.open_consumer(s, c).await;
        }
        let last = self.model[s].last_seq;
        let through = last * u64::from(permille) / 1000 + u64::from(permille >= 1000);
        let result = self.queue().ack(STREAMS[s], CONSUMERS[c], through).await;
        let m = &mut self.model[s];
        if last == 0 {
            assert!(
                matches!(result, Err(Error::StreamNotFound(_))),
                "{result:?}"
            );
        } else if through > last {
            match result {
                Err(Error::InvalidRequest(msg)) => {
                    assert!(
                        msg.contains(&through.to_string()) && msg.contains(&last.to_string()),
                        "{msg}"
                    )
                }
                other => panic!("ack beyond the last seq gave {other:?}"),
            }
        } else {
            result.unwrap();
            let acked = m.consumers.entry(c).or_insert(0);
            *acked = (*acked).max(through);
            m.update_bound(self.max_frames);
        }
    }

    async fn read(&mut self, s: usize, permille: u16) {
        let m = &self.model[s];
        if m.last_seq == 0 {
            assert!(matches!(
                self.queue().subscribe(STREAMS[s], 0, false),
                Err(Error::StreamNotFound(_))
            ));
            return;
        }
        let after = m.last_seq * u64::from(permille) / 1000;
        let mut sub = self.queue().subscribe(STREAMS[s], after, false).unwrap();
        let mut next = after + 1;
        loop {
            match sub.next().await.unwrap() {
                SubEvent::Gap(Gap {
                    requested,
                    first_available,
                }) => {
                    // Background compaction may run between two reads, so
                    // a gap may also follow frames; it is never silent.
                    assert_eq!(requested, next);
                    assert!(first_available > next);
                    self.model[s].drop_below(first_available);
                    next = first_available;
                }
                SubEvent::Encoded { .. } => panic!("plain subscriptions deliver frames as values"),
                SubEvent::Frames(frames) => {
                    for (seq, frame) in frames {
                        assert_eq!(seq, next, "reads are contiguous");
                        let m = &self.model[s];
                        let Some(&(p, pseq)) = m.frames.get(&seq) else {
                            panic!("seq {seq} of {} delivered but not in the model", STREAMS[s]);
                        };
                        assert_eq!(frame.payload, payload(s, p, pseq));
                        next += 1;
                    }
                }
                SubEvent::End { last_seq } => {
                    assert_eq!(last_seq, self.model[s].last_seq);
                    assert_eq!(
                        next,
                        last_seq + 1,
                        "everything through the end was delivered"
                    );
                    break;
                }
            }
        }
    }

    /// The committed ranges agree with the model's bounds.
    fn check_ranges(&mut self) {
        for (i, m) in self.model.iter_mut().enumerate() {
            let range = self.queue.as_ref().unwrap().stream_range(STREAMS[i]);
            if m.last_seq == 0 {
                assert_eq!(range, None);
                continue;
            }
            let (first, last) = range.unwrap();
            assert_eq!(last, m.last_seq);
            // The range is published just after each commit, so it may
            // trail what a read already saw, but it never moves back.
            assert!(first >= m.range_first, "the first seq moved back");
            m.range_first = first;
            if first > m.first_seq() {
                m.drop_below(first);
            }
        }
    }
}

fn run_case(ops: Vec<Op>, max_frames: Option<u64>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tether.redb");
        let opts = QueueOptions {
            retention: Retention {
                max_frames,
                max_bytes: None,
                max_age: None,
            },
            ..QueueOptions::default()
        };
        let mut h = Harness {
            queue: Some(Queue::open(&path, opts.clone()).unwrap()),
            model: (0..STREAMS.len()).map(|_| ModelStream::default()).collect(),
            max_frames,
        };
        for op in ops {
            h.run(op, &path, &opts).await;
        }
        // A final full read of every stream after a reopen.
        h.run(Op::Reopen, &path, &opts).await;
        for s in 0..STREAMS.len() {
            h.read(s, 0).await;
        }
        h.queue.take().unwrap().close().await.unwrap();
    });
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 32,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn queue_matches_the_model(
        ops in prop::collection::vec(op(), 1..40),
        max_frames in prop_oneof![Just(None), (5u64..30).prop_map(Some)],
    ) {
        run_case(ops, max_frames);
    }
}
