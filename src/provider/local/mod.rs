//! The local provider (to be written).
