//! Checkpoints and durable steps.

// One module in several files: the message types name each other freely,
// in code and in doc links.
use super::*;

/// See [`Request::CheckpointSave`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSave {
    pub execution: String,
    /// The worker's own format version for `data`; the daemon only stores it.
    pub schema_version: u32,
    pub data: Bytes,
}

/// A checkpoint without its data, as listed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointMeta {
    /// Increasing per execution.
    pub id: u64,
    /// The execution stream's last seq when the checkpoint was saved: output
    /// after it came after the checkpoint.
    pub seq: u64,
    pub schema_version: u32,
    pub size: u64,
    pub created_micros: u64,
    /// False when the stored checksum does not match the data; such a
    /// checkpoint is never loaded.
    pub valid: bool,
}

/// A checkpoint with its data. Only valid checkpoints are returned.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub data: Bytes,
}

/// Metadata a user keeps with a checkpoint (`--meta K=V`), in the order
/// given. The daemon only stores it.
pub type UserMeta = Vec<(String, String)>;

/// See [`Request::CheckpointSaveFull`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointSaveFull {
    pub execution: String,
    pub schema_version: u32,
    pub data: Bytes,
    pub user_meta: UserMeta,
    /// Save even when the execution has ended (to mend state before it is
    /// resumed).
    pub force: bool,
}

/// A checkpoint as listed, with its [`UserMeta`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub meta: CheckpointMeta,
    pub user_meta: UserMeta,
}

/// A valid checkpoint with its [`UserMeta`] and its data.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CheckpointFull {
    pub meta: CheckpointMeta,
    pub user_meta: UserMeta,
    pub data: Bytes,
}

/// One recorded durable step, as listed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct StepInfo {
    pub name: String,
    /// The result's length in bytes.
    pub size: u64,
    /// When it was recorded, microseconds since the Unix epoch; 0 when the
    /// store that recorded it kept no time.
    pub recorded_micros: u64,
}
