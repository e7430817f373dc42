//! The project's own short word list for the `relations` generator (written here, never
//! downloaded): common lowercase English nouns and verbs. Each of the 64 is one token of
//! SmolLM2-135M's vocabulary when preceded by a space (`Ġword` is in the GGUF's
//! `tokenizer.ggml.tokens`; checked once with the `gguf` Python package).

/// 64 common English nouns and verbs, lowercase, distinct.
pub const COMMON_WORDS: &[&str] = &[
    "apple", "house", "water", "river", "stone", "paper", "glass", "chair", "table", "horse",
    "bread", "light", "music", "money", "night", "plant", "train", "world", "field", "heart",
    "dog", "cat", "bird", "tree", "door", "book", "ship", "road", "fish", "milk", "rain", "wind",
    "sun", "moon", "star", "hand", "king", "city", "game", "song", "run", "walk", "jump", "sing",
    "read", "write", "swim", "cook", "build", "throw", "catch", "climb", "drive", "sleep", "speak",
    "teach", "learn", "paint", "dance", "laugh", "bring", "carry", "open", "close",
];

/// Checks a word list handed in by a caller: no empty word, no whitespace inside a word, no
/// bracket or quote character (the `relations` generator uses them as its own symbols), no
/// duplicate.
///
/// # Errors
/// The reason, naming the first offending word (by index).
pub fn check_words<S: AsRef<str>>(words: &[S]) -> std::result::Result<(), String> {
    let mut seen = std::collections::BTreeSet::new();
    for (i, w) in words.iter().enumerate() {
        let w = w.as_ref();
        if w.is_empty() {
            return Err(format!("word {i} is empty"));
        }
        if w.chars().any(char::is_whitespace) {
            return Err(format!("word {i} ({w:?}) contains whitespace"));
        }
        if w.chars().any(|c| "()[]\"".contains(c)) {
            return Err(format!(
                "word {i} ({w:?}) contains a bracket or a double quote"
            ));
        }
        if !seen.insert(w) {
            return Err(format!("word {i} ({w:?}) is a duplicate"));
        }
    }
    Ok(())
}

/// Reads a word list: one word per line, surrounding whitespace trimmed, blank lines skipped,
/// then checked ([`check_words`]).
///
/// # Errors
/// [`crate::TasksError::Io`] if the file cannot be read; [`crate::TasksError::PromptLine`]
/// naming the file and the line of a word that [`check_words`] refuses (whitespace inside, a
/// bracket or quote, a duplicate), or line 0 for a file without a word.
pub fn read_words(path: &std::path::Path) -> crate::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).map_err(|source| crate::TasksError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut words: Vec<String> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let w = line.trim();
        if w.is_empty() {
            continue;
        }
        words.push(w.to_string());
        check_words(&words).map_err(|reason| crate::TasksError::PromptLine {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        })?;
    }
    if words.is_empty() {
        return Err(crate::TasksError::PromptLine {
            path: path.to_path_buf(),
            line: 0,
            reason: "the file holds no word (one word per line expected)".into(),
        });
    }
    Ok(words)
}
