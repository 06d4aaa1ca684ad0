//! The log file's header: what the log says about itself, so that damage
//! to it, or its loss, is never mistaken for a log that simply ends.
//!
//! The first [`HEADER_LEN`] bytes of the log file are the header; the
//! records follow. It has two parts:
//!
//! * the *identity*, written once when the log is made and never again:
//!   a magic string, the format version, the store's id (also kept in the
//!   store, so that a log is never replayed into another store) and the
//!   capacity. Any change to it is damage.
//! * two *mark slots*, written in turn, each with its own checksum and a
//!   generation: the newest valid one says which records must be in the
//!   log. A crash can tear the slot being written, never both, so one
//!   slot failing its check is not damage; both failing is.
//!
//! A mark never claims more than is true on disk: [`Marks::synced`] is set
//! only after the `fdatasync` that covered that record returned, and
//! [`Marks::persisted`] only after the store's durable commit returned.
//! Each is written in place with `pwrite` and reaches the disk with the
//! log's next sync.

/// Bytes of the log file before its first record: one page.
pub const HEADER_LEN: u64 = 4096;

/// The log's magic string.
pub const MAGIC: [u8; 8] = *b"TETHRLOG";

/// The layout this build writes: records after a header page.
pub const FORMAT_VERSION: u32 = 1;

/// Where the identity ends (its checksum is the 4 bytes before).
const IDENTITY_LEN: usize = 44;

/// Where each mark slot starts, and its length.
const SLOTS: [usize; 2] = [512, 1024];
const SLOT_LEN: usize = 52;

/// What the log says about itself, once, when it is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The store this log belongs to.
    pub store_id: u128,
    /// The log's capacity: where it goes round.
    pub capacity: u64,
}

/// Which records the log must hold, as the newest valid slot says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// Records through this number are durably in the store.
    pub persisted: u64,
    /// Where record `persisted + 1` goes (a position in the log, counting
    /// laps when it goes round).
    pub start: u64,
    /// Records through this number were synced, and may have been
    /// acknowledged: they must be there, one after another from `start`.
    pub synced: u64,
    /// Going round: the first record whose chunks the store still reads
    /// from the log (records from here to `start` must be whole too).
    pub tail: u64,
}

/// Why a header cannot be read: damage, with the byte it is at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderDamage {
    /// The byte of the log file where the damage is.
    pub offset: u64,
    pub detail: String,
}

/// A header read back: its identity, and its newest valid marks (with the
/// slot they came from, so that the next write goes to the other one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub identity: Identity,
    pub marks: Marks,
    /// The newest valid slot's generation; 0 when neither slot was ever
    /// written.
    pub generation: u64,
}

/// The header of a new log: its identity and empty marks.
pub fn encode_new(identity: Identity) -> Vec<u8> {
    let mut page = vec![0u8; HEADER_LEN as usize];
    page[0..8].copy_from_slice(&MAGIC);
    page[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    page[16..32].copy_from_slice(&identity.store_id.to_le_bytes());
    page[32..40].copy_from_slice(&identity.capacity.to_le_bytes());
    let crc = crc32fast::hash(&page[..IDENTITY_LEN - 4]);
    page[IDENTITY_LEN - 4..IDENTITY_LEN].copy_from_slice(&crc.to_le_bytes());
    page
}

/// A mark slot's bytes for `generation`, and the byte of the file they go
/// to: slots are written in turn, so a torn write leaves the other one.
pub fn encode_marks(marks: &Marks, generation: u64) -> (u64, [u8; SLOT_LEN]) {
    let mut slot = [0u8; SLOT_LEN];
    let fields = [
        generation,
        marks.persisted,
        marks.start,
        marks.synced,
        marks.tail,
    ];
    for (i, field) in fields.iter().enumerate() {
        slot[i * 8..i * 8 + 8].copy_from_slice(&field.to_le_bytes());
    }
    let crc = crc32fast::hash(&slot[..40]);
    slot[40..44].copy_from_slice(&crc.to_le_bytes());
    (SLOTS[(generation % 2) as usize] as u64, slot)
}

/// Reads a header page. `page` is what the file holds at its start (shorter
/// when the file is).
pub fn decode(page: &[u8]) -> Result<Header, HeaderDamage> {
    if page.len() < HEADER_LEN as usize {
        return Err(HeaderDamage {
            offset: page.len() as u64,
            detail: format!(
                "the file is {} bytes, shorter than its {HEADER_LEN}-byte header",
                page.len()
            ),
        });
    }
    if page[0..8] != MAGIC {
        return Err(HeaderDamage {
            offset: 0,
            detail: "the header does not start with the log's magic bytes".into(),
        });
    }
    let crc = u32_at(page, IDENTITY_LEN - 4);
    if crc32fast::hash(&page[..IDENTITY_LEN - 4]) != crc {
        return Err(HeaderDamage {
            offset: 0,
            detail: format!("the header's first {IDENTITY_LEN} bytes fail their checksum"),
        });
    }
    let version = u32_at(page, 8);
    if version != FORMAT_VERSION {
        return Err(HeaderDamage {
            offset: 8,
            detail: format!(
                "log format version {version}; this build reads version {FORMAT_VERSION}"
            ),
        });
    }
    let identity = Identity {
        store_id: u128::from_le_bytes(bytes_at(page, 16)),
        capacity: u64_at(page, 32),
    };
    let slots: Vec<(u64, Marks)> = SLOTS.iter().filter_map(|&at| slot_at(page, at)).collect();
    let never_written = SLOTS
        .iter()
        .all(|&at| page[at..at + SLOT_LEN].iter().all(|&b| b == 0));
    match slots.into_iter().max_by_key(|(generation, _)| *generation) {
        Some((generation, marks)) => Ok(Header {
            identity,
            marks,
            generation,
        }),
        None if never_written => Ok(Header {
            identity,
            marks: Marks::default(),
            generation: 0,
        }),
        None => Err(HeaderDamage {
            offset: SLOTS[0] as u64,
            detail: "both mark slots of the header fail their checksums".into(),
        }),
    }
}

fn slot_at(page: &[u8], at: usize) -> Option<(u64, Marks)> {
    let slot = &page[at..at + SLOT_LEN];
    if crc32fast::hash(&slot[..40]) != u32_at(slot, 40) {
        return None;
    }
    let generation = u64_at(slot, 0);
    // Generation 0 is never written: an all-zero slot is an unused one.
    (generation > 0).then(|| {
        (
            generation,
            Marks {
                persisted: u64_at(slot, 8),
                start: u64_at(slot, 16),
                synced: u64_at(slot, 24),
                tail: u64_at(slot, 32),
            },
        )
    })
}

fn bytes_at<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes_at(bytes, at))
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes_at(bytes, at))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const ID: Identity = Identity {
        store_id: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
        capacity: 1 << 20,
    };

    fn with_marks(page: &mut [u8], marks: &Marks, generation: u64) {
        let (at, slot) = encode_marks(marks, generation);
        page[at as usize..at as usize + SLOT_LEN].copy_from_slice(&slot);
    }

    #[test]
    fn a_new_header_reads_back_with_empty_marks() {
        let page = encode_new(ID);
        let header = decode(&page).unwrap();
        assert_eq!(header.identity, ID);
        assert_eq!(header.marks, Marks::default());
        assert_eq!(header.generation, 0);
    }

    #[test]
    fn the_newest_valid_slot_wins_and_a_torn_one_is_not_damage() {
        let mut page = encode_new(ID);
        let old = Marks {
            persisted: 3,
            start: 100,
            synced: 7,
            tail: 50,
        };
        let new = Marks { synced: 9, ..old };
        with_marks(&mut page, &old, 1);
        with_marks(&mut page, &new, 2);
        assert_eq!(decode(&page).unwrap().marks, new);
        // The slot of generation 2 torn: generation 1 stands.
        let (at, _) = encode_marks(&new, 2);
        page[at as usize + 3] ^= 0xff;
        let header = decode(&page).unwrap();
        assert_eq!((header.marks, header.generation), (old, 1));
        // Both torn: damage, at the first slot.
        let (at, _) = encode_marks(&old, 1);
        page[at as usize + 3] ^= 0xff;
        let damage = decode(&page).unwrap_err();
        assert_eq!(damage.offset, 512);
    }

    #[test]
    fn any_flip_in_the_identity_is_damage_at_its_byte() {
        let page = encode_new(ID);
        for byte in 0..IDENTITY_LEN {
            let mut flipped = page.clone();
            flipped[byte] ^= 0x01;
            let damage = decode(&flipped).unwrap_err();
            assert!(damage.offset <= 8, "byte {byte}: {damage:?}");
        }
    }

    #[test]
    fn a_short_or_foreign_file_is_damage() {
        let page = encode_new(ID);
        let short = decode(&page[..100]).unwrap_err();
        assert_eq!(short.offset, 100);
        assert!(short.detail.contains("shorter than its 4096-byte header"));
        let zeros = vec![0u8; HEADER_LEN as usize];
        assert_eq!(decode(&zeros).unwrap_err().offset, 0);
    }
}
