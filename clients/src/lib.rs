//! Shared helpers of the client scenario suite (the scenarios are in tests/).
