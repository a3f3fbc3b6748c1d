//! neardup's fingerprint stage in Rust: the same values as `neardup/fingerprint.py`'s
//! Python path, bit for bit, without a Python object per word.
//!
//! The Python path segments with rjieba (jieba-rs), then works on each page's few hundred
//! words with numpy calls whose fixed cost dominates arrays that small. This module runs
//! the same jieba-rs version on the text and computes every feature in one pass over its
//! tokens. Everything that decides a value comes from Python at construction: the
//! stopwords, the synonyms, the keyword lexicon, and a table of character classes made
//! from Python's own `re` and `str` predicates, so that no Unicode table of Rust's can
//! disagree with the Python path. `tests/unit/test_native.py` checks both paths agree.

use std::collections::{HashMap, HashSet};

use jieba_rs::Jieba;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Character classes, one byte a code point (`neardup/fingerprint.py`, `char_classes`).
const WORD: u8 = 1; // re's \w: str.isalnum() or "_"
const ALNUM: u8 = 2; // str.isalnum(): \w without "_"
const DECIMAL: u8 = 4; // re's \d
const SPACE: u8 = 8; // re's \s
const DIGIT: u8 = 16; // str.isdigit()

const PAIR_SEED: u64 = 0x9E37_79B9_7F4A_7C15;
const SHINGLE_MULT: u64 = 0x0000_0100_0000_01B3;

/// SplitMix64's finaliser (`fingerprint._mix`).
#[inline]
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Hash of the ordered pair (a, b) of word hashes (`fingerprint.combine`).
#[inline]
fn combine(a: u64, b: u64) -> u64 {
    mix(a ^ mix(b.wrapping_add(PAIR_SEED)))
}

#[inline]
fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// MurmurHash3 x64_128 with seed 0, its first 64 bits: `mmh3.hash64(data)[0]` as unsigned.
fn murmur64(data: &[u8]) -> u64 {
    const C1: u64 = 0x87c3_7b91_1142_53d5;
    const C2: u64 = 0x4cf5_ad43_2745_937f;
    let (mut h1, mut h2) = (0u64, 0u64);
    let blocks = data.len() / 16;
    for i in 0..blocks {
        let at = i * 16;
        let mut k1 = u64::from_le_bytes(data[at..at + 8].try_into().unwrap());
        let mut k2 = u64::from_le_bytes(data[at + 8..at + 16].try_into().unwrap());
        k1 = k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2);
        h1 ^= k1;
        h1 = h1
            .rotate_left(27)
            .wrapping_add(h2)
            .wrapping_mul(5)
            .wrapping_add(0x52dc_e729);
        k2 = k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1);
        h2 ^= k2;
        h2 = h2
            .rotate_left(31)
            .wrapping_add(h1)
            .wrapping_mul(5)
            .wrapping_add(0x3849_5ab5);
    }
    let tail = &data[blocks * 16..];
    let (mut k1, mut k2) = (0u64, 0u64);
    for (i, &byte) in tail.iter().enumerate() {
        if i < 8 {
            k1 ^= u64::from(byte) << (8 * i);
        } else {
            k2 ^= u64::from(byte) << (8 * (i - 8));
        }
    }
    if tail.len() > 8 {
        h2 ^= k2.wrapping_mul(C2).rotate_left(33).wrapping_mul(C1);
    }
    if !tail.is_empty() {
        h1 ^= k1.wrapping_mul(C1).rotate_left(31).wrapping_mul(C2);
    }
    let len = data.len() as u64;
    h1 ^= len;
    h2 ^= len;
    h1 = h1.wrapping_add(h2);
    h2 = h2.wrapping_add(h1);
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1.wrapping_add(h2)
}

/// Charikar's SimHash of features each weighing one (`fingerprint.simhash_weighted` with
/// integer counts: a feature counted n times is n features here).
fn simhash(features: &[u64]) -> u64 {
    if features.is_empty() {
        return 0;
    }
    let mut set = [0i64; 64];
    for &h in features {
        for (bit, count) in set.iter_mut().enumerate() {
            *count += ((h >> bit) & 1) as i64;
        }
    }
    let total = features.len() as i64;
    set.iter()
        .enumerate()
        .filter(|(_, &n)| 2 * n - total > 0)
        .fold(0u64, |fp, (bit, _)| fp | (1u64 << bit))
}

fn le_bytes<T: Copy, const N: usize>(values: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * N);
    for &v in values {
        out.extend_from_slice(&to(v));
    }
    out
}

/// What `fingerprint.fingerprint` returns, before it becomes a `Fingerprints`.
struct Computed {
    fp1: u64,
    fp2: u64,
    strings: Vec<u64>,
    words: usize,
    shingles: usize,
    sketch: Vec<u32>,
    piece_strings: Vec<u64>,
    shingle_hashes: Vec<u32>,
    piece_chars: Vec<u32>,
}

#[pyclass(frozen)]
struct Fingerprinter {
    jieba: Jieba,
    stopwords: HashSet<String>,
    synonyms: HashMap<String, String>,
    lexicon: HashMap<u64, f64>,
    median_idf: f64,
    classes: Vec<u8>,
}

impl Fingerprinter {
    #[inline]
    fn class(&self, c: char) -> u8 {
        self.classes[c as usize]
    }

    fn compute(
        &self,
        text: &str,
        keywords: usize,
        window: usize,
        period_len: usize,
        shingle_chars: usize,
        sketch_size: usize,
    ) -> Computed {
        // content words: not a stopword, and holding a word character
        let words: Vec<&str> = self
            .jieba
            .cut(text, true)
            .into_iter()
            .map(|t| t.word)
            .filter(|w| {
                w.chars().any(|c| self.class(c) & WORD != 0) && !self.stopwords.contains(*w)
            })
            .collect();

        // primary: consecutive word pairs
        let mut hash_of: HashMap<&str, u64> = HashMap::with_capacity(words.len());
        let hashes: Vec<u64> = words
            .iter()
            .map(|w| *hash_of.entry(w).or_insert_with(|| murmur64(w.as_bytes())))
            .collect();
        let pairs: Vec<u64> = hashes.windows(2).map(|p| combine(p[0], p[1])).collect();
        let fp1 = simhash(&pairs);

        // secondary: keyword windows over the synonym-folded words
        let mut canon_index: HashMap<&str, usize> = HashMap::with_capacity(words.len());
        let mut canon_words: Vec<&str> = Vec::new();
        let mut canon_first: Vec<usize> = Vec::new();
        let mut tf: Vec<i64> = Vec::new();
        let mut canon_ids: Vec<usize> = Vec::with_capacity(words.len());
        for (pos, w) in words.iter().enumerate() {
            let canon: &str = self.synonyms.get(*w).map_or(w, String::as_str);
            let id = *canon_index.entry(canon).or_insert_with(|| {
                canon_words.push(canon);
                canon_first.push(pos);
                tf.push(0);
                canon_words.len() - 1
            });
            tf[id] += 1;
            canon_ids.push(id);
        }
        let canon_hashes: Vec<u64> = canon_words
            .iter()
            .map(|w| {
                hash_of
                    .get(w)
                    .copied()
                    .unwrap_or_else(|| murmur64(w.as_bytes()))
            })
            .collect();
        let n = tf.iter().sum::<i64>().max(1) as f64;
        // numpy's order of operations, for the same floats
        let score: Vec<f64> = canon_words
            .iter()
            .enumerate()
            .map(|(k, w)| {
                let mut idf = self
                    .lexicon
                    .get(&canon_hashes[k])
                    .copied()
                    .unwrap_or(self.median_idf);
                let length = w.chars().count() as f64;
                let digits = !w.is_empty() && w.chars().all(|c| self.class(c) & DIGIT != 0);
                if length < 2.0 || digits {
                    idf = -1.0;
                }
                if idf < 0.0 {
                    return -1.0;
                }
                let position = 1.5 - 0.5 * canon_first[k] as f64 / n;
                let size = 0.8 + 0.1 * length.min(5.0);
                tf[k] as f64 * idf * position * size
            })
            .collect();
        let mut order: Vec<usize> = (0..score.len()).collect();
        // numpy's stable argsort of -score: larger scores first, ties in vocabulary order
        order.sort_by(|&a, &b| (-score[a]).partial_cmp(&-score[b]).unwrap());
        let mut chosen = vec![false; canon_words.len()];
        for &k in order.iter().take(keywords) {
            if score[k] > 0.0 {
                chosen[k] = true;
            }
        }
        let mut windowed: Vec<u64> = Vec::new();
        for (at, &id) in canon_ids.iter().enumerate() {
            if !chosen[id] {
                continue;
            }
            let lo = at.saturating_sub(window);
            let hi = (at + window).min(canon_ids.len() - 1);
            for nb in lo..=hi {
                if nb != at {
                    windowed.push(combine(canon_hashes[id], canon_hashes[canon_ids[nb]]));
                }
            }
        }
        let fp2 = simhash(&windowed);

        // period pieces, their strings and the character 5-grams
        let (pieces, codes, piece_chars) = self.pieces(text, period_len);
        let piece_strings: Vec<u64> = pieces.iter().map(|s| s.unwrap_or(0)).collect();
        let shingle_hashes: Vec<u32> = if codes.is_empty() {
            Vec::new()
        } else {
            // the text's own length when it is shorter than a shingle: one shingle
            let width = shingle_chars.min(codes.len());
            (0..codes.len() - width + 1)
                .map(|start| {
                    let mut h = u64::from(codes[start]);
                    for &c in &codes[start + 1..start + width] {
                        h = h.wrapping_mul(SHINGLE_MULT).wrapping_add(u64::from(c));
                    }
                    (mix(h) >> 32) as u32
                })
                .collect()
        };
        let mut distinct = shingle_hashes.clone();
        distinct.sort_unstable();
        distinct.dedup();
        let mut strings: Vec<u64> = piece_strings.iter().copied().filter(|&s| s != 0).collect();
        strings.sort_unstable();
        strings.dedup();
        Computed {
            fp1,
            fp2,
            strings,
            words: words.len(),
            shingles: distinct.len(),
            sketch: distinct.iter().copied().take(sketch_size).collect(),
            piece_strings,
            shingle_hashes,
            piece_chars,
        }
    }

    /// `fingerprint.piece_features`: each piece's period-string hash (None for the last
    /// piece and empty ones), the code points of the text's letters, digits and
    /// ideographs, and each piece's count of them.
    fn pieces(&self, text: &str, period_len: usize) -> (Vec<Option<u64>>, Vec<u32>, Vec<u32>) {
        let mut strings = Vec::new();
        let mut codes: Vec<u32> = Vec::with_capacity(text.len() / 3);
        let mut lengths = Vec::new();
        let mut start = 0usize; // where the current piece's content begins in codes
        let mut prev: Option<char> = None;
        let mut chars = text.chars().peekable();
        let mut piece = String::new();
        let mut close = |codes: &[u32], start: usize, last: bool, piece: &mut String| {
            let content = &codes[start..];
            lengths.push(content.len() as u32);
            strings.push(if last || content.is_empty() {
                None
            } else {
                piece.clear();
                // Python's c[-period_len:], which is the whole of c for 0
                let from = if period_len == 0 {
                    0
                } else {
                    content.len().saturating_sub(period_len)
                };
                piece.extend(content[from..].iter().map(|&c| char::from_u32(c).unwrap()));
                Some(murmur64(piece.as_bytes()))
            });
        };
        while let Some(c) = chars.next() {
            let period = match c {
                '。' | '!' | '?' => true,
                '.' => {
                    prev.is_some_and(|p| {
                        let k = self.class(p);
                        k & ALNUM != 0 && k & DECIMAL == 0
                    }) && chars
                        .peek()
                        .is_none_or(|&next| self.class(next) & SPACE != 0)
                }
                _ => false,
            };
            if period {
                close(&codes, start, false, &mut piece);
                start = codes.len();
            } else if self.class(c) & ALNUM != 0 {
                codes.push(c as u32);
            }
            prev = Some(c);
        }
        close(&codes, start, true, &mut piece);
        (strings, codes, lengths)
    }
}

#[pymethods]
impl Fingerprinter {
    /// ``classes``: a byte a code point (0x110000 of them), the bits above.
    /// ``lexicon_keys`` and ``lexicon_weights``: little-endian u64 and f64 arrays.
    #[new]
    fn new(
        stopwords: Vec<String>,
        synonyms: HashMap<String, String>,
        lexicon_keys: &[u8],
        lexicon_weights: &[u8],
        median_idf: f64,
        classes: Vec<u8>,
    ) -> PyResult<Self> {
        if classes.len() != 0x11_0000 {
            return Err(PyValueError::new_err(
                "classes: one byte for each code point",
            ));
        }
        if lexicon_keys.len() % 8 != 0 || lexicon_keys.len() != lexicon_weights.len() {
            return Err(PyValueError::new_err(
                "lexicon: as many u64 keys as f64 weights",
            ));
        }
        let keys = lexicon_keys
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
        let weights = lexicon_weights
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap()));
        Ok(Self {
            jieba: Jieba::new(),
            stopwords: stopwords.into_iter().collect(),
            synonyms,
            lexicon: keys.zip(weights).collect(),
            median_idf,
            classes,
        })
    }

    /// The sorted, distinct hashes of the period strings of ``text``:
    /// ``{hash64(s) for s in fingerprint.period_strings(text, period_len)}``.
    fn period_hashes(&self, py: Python<'_>, text: &str, period_len: usize) -> Vec<u64> {
        py.detach(|| {
            let mut hashes: Vec<u64> = self
                .pieces(text, period_len)
                .0
                .into_iter()
                .flatten()
                .collect();
            hashes.sort_unstable();
            hashes.dedup();
            hashes
        })
    }

    /// jieba-rs's words of ``text`` (HMM on): what ``rjieba.cut`` returns.
    fn cut<'a>(&self, text: &'a str) -> Vec<&'a str> {
        self.jieba
            .cut(text, true)
            .into_iter()
            .map(|t| t.word)
            .collect()
    }

    /// ``mmh3.hash64(data)[0]`` as an unsigned integer.
    #[staticmethod]
    fn murmur64(data: &[u8]) -> u64 {
        murmur64(data)
    }

    /// (fp1, fp2, strings, words, shingles, sketch, piece_strings, shingle_hashes,
    /// piece_chars): the fields of ``Fingerprints``, the byte strings little-endian.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn fingerprint<'py>(
        &self,
        py: Python<'py>,
        text: &str,
        keywords: usize,
        window: usize,
        period_len: usize,
        shingle_chars: usize,
        sketch_size: usize,
    ) -> (
        u64,
        u64,
        Vec<u64>,
        usize,
        usize,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
        Bound<'py, PyBytes>,
    ) {
        let c = py.detach(|| {
            self.compute(
                text,
                keywords,
                window,
                period_len,
                shingle_chars,
                sketch_size,
            )
        });
        (
            c.fp1,
            c.fp2,
            c.strings,
            c.words,
            c.shingles,
            PyBytes::new(py, &le_bytes(&c.sketch, u32::to_le_bytes)),
            PyBytes::new(py, &le_bytes(&c.piece_strings, u64::to_le_bytes)),
            PyBytes::new(py, &le_bytes(&c.shingle_hashes, u32::to_le_bytes)),
            PyBytes::new(py, &le_bytes(&c.piece_chars, u32::to_le_bytes)),
        )
    }
}

/// Bumped with every change to what `Fingerprinter` computes: `neardup/fingerprint.py`
/// uses a module only of the format it was written against.
const FORMAT: u32 = 1;

/// Imported as `neardup._native`: hatch_build.py puts it inside the `neardup` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("FORMAT", FORMAT)?;
    m.add_class::<Fingerprinter>()?;
    Ok(())
}
