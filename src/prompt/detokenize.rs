//! Streaming detokenization: text deltas as ids arrive.
//!
//! Decoding ids one at a time is wrong twice over: a byte-fallback character (an emoji is
//! four `<0xNN>` ids) is incomplete until its last byte arrives, and decoders that strip or
//! merge spaces look at neighbouring tokens. So each step decodes a short window of recent
//! ids and emits only the text that the new id appended, holding back anything that still
//! ends in an incomplete character (U+FFFD). This is the window scheme of Hugging Face's
//! text-generation-inference.
use super::tokenizer::Tokenizer;
use crate::Result;

/// Emits the text of a growing id sequence piece by piece; the concatenated pieces equal
/// [`Tokenizer::decode`] of all ids, and no piece ever ends inside a UTF-8 character.
#[derive(Debug)]
pub struct IncrementalDecoder<'t> {
    tokenizer: &'t Tokenizer,
    ids: Vec<u32>,
    /// Start of the window decoded as context (its text was already emitted).
    prefix_offset: usize,
    /// End of the ids whose text was already emitted.
    read_offset: usize,
}

impl<'t> IncrementalDecoder<'t> {
    /// A decoder with no ids yet.
    pub fn new(tokenizer: &'t Tokenizer) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
        }
    }

    /// The ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Appends one id; returns the new text it completes (empty while a character is
    /// still incomplete, or for a skipped special token).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let window = &self.ids[self.prefix_offset..];
        let prefix_text = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let new_text = self.tokenizer.decode(window)?;
        if new_text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        match new_text.get(prefix_text.len()..) {
            Some(delta) if new_text.starts_with(&prefix_text) => {
                let delta = delta.to_string();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.ids.len();
                Ok(delta)
            }
            // The decoder rewrote earlier text (rare); wait for more context.
            _ => Ok(String::new()),
        }
    }

    /// Flushes whatever is held back (e.g. a sequence that really ends in U+FFFD or in an
    /// incomplete byte sequence); call once after the last id.
    pub fn finish(&mut self) -> Result<String> {
        if self.read_offset == self.ids.len() {
            return Ok(String::new());
        }
        let prefix_text = self
            .tokenizer
            .decode(&self.ids[self.prefix_offset..self.read_offset])?;
        let new_text = self.tokenizer.decode(&self.ids[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        // Emit what follows the longest common prefix so that nothing is repeated even if
        // the decoder rewrote the context window.
        let common: usize = new_text
            .char_indices()
            .zip(prefix_text.chars())
            .take_while(|((_, a), b)| a == b)
            .map(|((_, a), _)| a.len_utf8())
            .sum();
        Ok(new_text[common..].to_string())
    }
}
