//! What a failed row keeps of its error.

/// Keeps `last_error` within its column (VARCHAR(1024)), cutting on a character boundary.
pub fn truncate_error(reason: &str) -> String {
    reason.chars().take(1000).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_cut_on_character_boundaries() {
        let long = "é".repeat(2000);
        let cut = truncate_error(&long);
        assert_eq!(cut.chars().count(), 1000);
        assert_eq!(truncate_error("short"), "short");
    }
}
