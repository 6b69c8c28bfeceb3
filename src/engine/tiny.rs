//! The tiny candle transformer backend (being written).
