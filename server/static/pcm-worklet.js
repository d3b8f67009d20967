// AudioWorklet processor: turns the microphone's float32 render quanta into 16-bit PCM chunks.
// Runs on the audio thread at the AudioContext's real sample rate; posts one ArrayBuffer of
// little-endian int16 samples (mono, first channel) per `chunkSamples` to the main thread.
class PcmCapture extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = (options && options.processorOptions) || {};
    this.chunkSamples = Math.max(128, opts.chunkSamples || 2400);
    this.buf = new Int16Array(this.chunkSamples);
    this.fill = 0;
    this.active = true;
    this.port.onmessage = (e) => {
      if (e.data === "stop") {
        this.flush();
        this.active = false;
      }
    };
  }

  flush() {
    if (this.fill === 0) return;
    const out = this.buf.slice(0, this.fill);
    this.port.postMessage(out.buffer, [out.buffer]);
    this.fill = 0;
  }

  process(inputs) {
    if (!this.active) return false;
    const input = inputs[0];
    if (input && input.length > 0) {
      const ch = input[0];
      for (let i = 0; i < ch.length; i++) {
        let s = ch[i];
        s = s > 1 ? 1 : s < -1 ? -1 : s;
        this.buf[this.fill++] = s < 0 ? Math.round(s * 32768) : Math.round(s * 32767);
        if (this.fill === this.chunkSamples) {
          this.port.postMessage(this.buf.buffer, [this.buf.buffer]);
          this.buf = new Int16Array(this.chunkSamples);
          this.fill = 0;
        }
      }
    }
    return true;
  }
}

registerProcessor("pcm-capture", PcmCapture);
