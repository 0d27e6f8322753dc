//! `tcp`: a full mesh over TCP (work in progress).
