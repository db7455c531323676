// Where the client writes what an operator should know (reconnects, local fallback picks).

/** Any object with a `warn` method, such as `console` or a pino/winston logger. */
export interface Logger {
  warn(message: string): void;
}

/** Writes to `console.warn`. */
export const consoleLogger: Logger = {
  warn(message: string): void {
    console.warn(message);
  },
};
