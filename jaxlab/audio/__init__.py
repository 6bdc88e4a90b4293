"""Speech: Whisper's log-mel front end (`mel`) and the ASR entry point (`asr`)."""
