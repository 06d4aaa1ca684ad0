//! `tether streams`: one row per stream with its retained range, size and
//! durable consumers. `--json`: one object per stream with the fields
//! `name`, `first_seq`, `last_seq`, `frames`, `bytes` and `consumers` (a
//! list of `{"name","acked_through"}`).

use tether::Result;
use tether_protocol::StreamInfo;

use super::{write_stdout, Context};

/// Runs `tether streams`.
pub async fn run(ctx: &Context) -> Result<()> {
    let streams = tether::sdk::streams(&ctx.connector("streams")).await?;
    let text = if ctx.json {
        json_lines(&streams)?
    } else {
        table(&streams)
    };
    write_stdout(text.as_bytes())?;
    Ok(())
}

fn json_lines(streams: &[StreamInfo]) -> Result<String> {
    streams
        .iter()
        .map(|stream| Ok(tether::json::stream(stream)?.to_string() + "\n"))
        .collect()
}

/// A left-aligned table; consumers as `name=ack`, comma-separated, or `-`.
fn table(streams: &[StreamInfo]) -> String {
    let header = ["STREAM", "FIRST", "LAST", "FRAMES", "BYTES", "CONSUMERS"].map(String::from);
    let mut rows = vec![header];
    for s in streams {
        let consumers = if s.consumers.is_empty() {
            "-".to_owned()
        } else {
            s.consumers
                .iter()
                .map(|c| format!("{}={}", c.name, c.acked_through))
                .collect::<Vec<_>>()
                .join(",")
        };
        rows.push([
            s.name.clone(),
            s.first_seq.to_string(),
            s.last_seq.to_string(),
            s.frames.to_string(),
            s.bytes.to_string(),
            consumers,
        ]);
    }
    let mut widths = [0usize; 6];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in &rows {
        let last = row.len() - 1;
        for (i, cell) in row.iter().enumerate() {
            if i == last {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use tether_protocol::ConsumerInfo;

    fn sample() -> Vec<StreamInfo> {
        vec![
            StreamInfo {
                name: "logs".into(),
                first_seq: 5,
                last_seq: 120,
                frames: 116,
                bytes: 29_696,
                consumers: vec![
                    ConsumerInfo {
                        name: "a".into(),
                        acked_through: 4,
                    },
                    ConsumerInfo {
                        name: "b".into(),
                        acked_through: 120,
                    },
                ],
            },
            StreamInfo {
                name: "empty".into(),
                first_seq: 1,
                last_seq: 0,
                frames: 0,
                bytes: 0,
                consumers: vec![],
            },
        ]
    }

    #[test]
    fn the_table_has_one_aligned_row_per_stream() {
        assert_eq!(
            table(&sample()),
            "STREAM  FIRST  LAST  FRAMES  BYTES  CONSUMERS\n\
             logs    5      120   116     29696  a=4,b=120\n\
             empty   1      0     0       0      -\n"
        );
    }

    #[test]
    fn json_has_one_object_per_line() {
        assert_eq!(
            json_lines(&sample()).unwrap(),
            "{\"name\":\"logs\",\"first_seq\":5,\"last_seq\":120,\"frames\":116,\"bytes\":29696,\
             \"consumers\":[{\"name\":\"a\",\"acked_through\":4},{\"name\":\"b\",\"acked_through\":120}]}\n\
             {\"name\":\"empty\",\"first_seq\":1,\"last_seq\":0,\"frames\":0,\"bytes\":0,\"consumers\":[]}\n"
        );
    }
}
