//! Reading a JetStream stream back, whole, for tests of the mirror (the
//! test crate has no async runtime of its own).

use futures_util::stream::{self, StreamExt};

/// One message as JetStream holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    pub subject: String,
    /// Header names and values, in the order they were read.
    pub headers: Vec<(String, String)>,
    pub payload: Vec<u8>,
}

/// Every message of JetStream stream `name` on the server at `url`, in
/// stream order. Blocks; runs its own runtime.
pub fn read_all(url: &str, name: &str) -> Result<Vec<Held>, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    runtime.block_on(read(url, name))
}

async fn read(url: &str, name: &str) -> Result<Vec<Held>, String> {
    let client = async_nats::connect(url)
        .await
        .map_err(|e| format!("cannot connect to {url}: {e}"))?;
    let js = async_nats::jetstream::new(client);
    let stream = js
        .get_stream(name)
        .await
        .map_err(|e| format!("no stream {name}: {e}"))?;
    let state = stream.cached_info().state.clone();
    let seqs = state.first_sequence..=state.last_sequence;
    let messages: Vec<_> = stream::iter(seqs)
        .map(|seq| {
            let stream = &stream;
            async move { stream.get_raw_message(seq).await.map(|m| (seq, m)) }
        })
        .buffered(64)
        .collect()
        .await;
    let mut held = Vec::with_capacity(messages.len());
    for message in messages {
        let (_, message) = message.map_err(|e| format!("cannot read a message: {e}"))?;
        let headers = message
            .headers
            .iter()
            .flat_map(|(name, values)| {
                values
                    .iter()
                    .map(move |v| (name.to_string(), v.as_str().to_owned()))
            })
            .collect();
        held.push(Held {
            subject: message.subject.to_string(),
            headers,
            payload: message.payload.to_vec(),
        });
    }
    Ok(held)
}
