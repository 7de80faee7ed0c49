/**
 * A transport carries newline-free JSON-RPC messages to and from an app-server. `connect` resolves once
 * the channel is open and rejects (never hangs past `connectTimeoutMs`) when it cannot be opened. After
 * it resolved, `onClose` is called exactly once, whoever closed the channel.
 */
export interface HostTransport {
  /** For messages: the command line or the URL. */
  readonly describe: string;
  connect(handlers: TransportHandlers, connectTimeoutMs: number): Promise<HostChannel>;
}

export interface TransportHandlers {
  onMessage(text: string): void;
  onClose(reason: string): void;
}

export interface HostChannel {
  send(text: string): void;
  close(): void;
}
