//! Byte previews for operators: `hexdump -C` lines, because a dead letter's bytes are
//! often not text and must be shown without being trusted.

/// The first `limit` bytes of `bytes` as `hexdump -C` lines (offset, 16 hex bytes, the
/// printable ASCII), plus a line saying how much was left out.
pub fn hex_preview(bytes: &[u8], limit: usize) -> String {
    let shown = &bytes[..bytes.len().min(limit)];
    let mut out = String::new();
    for (i, chunk) in shown.chunks(16).enumerate() {
        let mut hex = String::with_capacity(49);
        for (j, b) in chunk.iter().enumerate() {
            if j == 8 {
                hex.push(' ');
            }
            hex.push_str(&format!("{b:02x} "));
        }
        let text: String = chunk
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        out.push_str(&format!("{:08x}  {hex:<49} |{text}|\n", i * 16));
    }
    if bytes.len() > shown.len() {
        out.push_str(&format!(
            "... {} more bytes ({} in all)\n",
            bytes.len() - shown.len(),
            bytes.len()
        ));
    }
    out
}

/// `bytes` as text when it is UTF-8 without control characters (other than whitespace),
/// i.e. when printing it cannot mislead or corrupt a terminal.
pub(crate) fn as_text(bytes: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(bytes).ok()?;
    text.chars()
        .all(|c| !c.is_control() || c == '\n' || c == '\t')
        .then_some(text)
}

/// Lower-case hex of all of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_look_like_hexdump() {
        let preview = hex_preview(b"\x00\x00\x00\x00\x07order-1 \xff", 256);
        assert_eq!(
            preview,
            "00000000  00 00 00 00 07 6f 72 64  65 72 2d 31 20 ff        |.....order-1 .|\n"
        );
    }

    #[test]
    fn long_input_is_cut_and_says_so() {
        let bytes = vec![b'a'; 300];
        let preview = hex_preview(&bytes, 256);
        assert_eq!(preview.lines().count(), 17);
        assert!(
            preview.ends_with("... 44 more bytes (300 in all)\n"),
            "{preview}"
        );
        assert!(preview.contains("000000f0  61 61"));
    }

    #[test]
    fn text_only_when_harmless() {
        assert_eq!(as_text(b"order-1"), Some("order-1"));
        assert_eq!(as_text(b"\x1b[2J"), None);
        assert_eq!(as_text(&[0xff]), None);
        assert_eq!(hex(&[0, 0xab]), "00ab");
    }
}
