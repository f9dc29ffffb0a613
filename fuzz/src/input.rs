//! Structured inputs from fuzz bytes: a reader that never fails (missing bytes read as
//! zero) and the writer that produces the bytes a reader reads back, for seeds.

/// Reads small values from the front of the fuzz bytes.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
}

impl<'a> Reader<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Reader<'a> {
        Reader { data }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The next byte; `0` once the input is used up.
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    /// A length: one byte below `0xF0`, else twelve bits over two bytes (up to 4095).
    pub fn length(&mut self) -> usize {
        let b = self.byte();
        if b < 0xF0 {
            usize::from(b)
        } else {
            usize::from(b & 0x0F) << 8 | usize::from(self.byte())
        }
    }

    /// A length-prefixed run of bytes (shorter when the input ends first).
    pub fn bytes(&mut self) -> &'a [u8] {
        let len = self.length().min(self.data.len());
        let (bytes, rest) = self.data.split_at(len);
        self.data = rest;
        bytes
    }

    /// A length-prefixed string; bytes that are not UTF-8 become U+FFFD.
    pub fn string(&mut self) -> String {
        String::from_utf8_lossy(self.bytes()).into_owned()
    }
}

/// Writes the bytes a [`Reader`] reads back.
#[derive(Debug, Clone, Default)]
pub struct Writer {
    bytes: Vec<u8>,
}

impl Writer {
    /// The bytes written so far.
    pub fn finish(self) -> Vec<u8> {
        self.bytes
    }

    /// One byte.
    pub fn byte(&mut self, b: u8) {
        self.bytes.push(b);
    }

    /// A length as [`Reader::length`] reads it.
    ///
    /// # Panics
    /// When `len` is over 4095: seeds are small.
    pub fn length(&mut self, len: usize) {
        assert!(len < 4_096, "a seed value of {len} bytes is too long");
        if len < 0xF0 {
            self.byte(len as u8);
        } else {
            self.byte(0xF0 | (len >> 8) as u8);
            self.byte(len as u8);
        }
    }

    /// A length-prefixed run of bytes.
    pub fn bytes(&mut self, bytes: &[u8]) {
        self.length(bytes.len());
        self.bytes.extend_from_slice(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_written_reads_back() {
        let long = vec![7u8; 600];
        let mut w = Writer::default();
        w.byte(3);
        w.bytes(b"openai#rpm");
        w.bytes(&long);
        w.length(0xEF);
        let bytes = w.finish();
        let mut r = Reader::new(&bytes);
        assert_eq!(r.byte(), 3);
        assert_eq!(r.string(), "openai#rpm");
        assert_eq!(r.bytes(), &long[..]);
        assert_eq!(r.length(), 0xEF);
        assert!(r.is_empty());
        assert_eq!(r.byte(), 0);
    }
}
