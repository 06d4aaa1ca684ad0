//! Left-aligned text tables: columns two spaces apart, the last column not
//! padded (so lines carry no trailing blanks).

/// Renders `rows` (the header first) as aligned lines.
pub fn render(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut widths = vec![0usize; columns];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                text.push_str(cell);
            } else {
                let pad = widths[i].saturating_sub(cell.chars().count());
                text.push_str(cell);
                text.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned_and_lines_not_padded() {
        let rows = vec![
            vec!["A".to_owned(), "LONG-HEADER".to_owned(), "Z".to_owned()],
            vec!["wide cell".to_owned(), "x".to_owned(), "last".to_owned()],
        ];
        assert_eq!(
            render(&rows),
            "A          LONG-HEADER  Z\nwide cell  x            last\n"
        );
        assert_eq!(render(&[]), "");
    }
}
