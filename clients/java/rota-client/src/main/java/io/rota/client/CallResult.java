package io.rota.client;

/** How a call to a picked instance went. */
public enum CallResult {
    OK,
    /** The instance could not be reached (connection refused, reset, timed out connecting). */
    CONNECT_FAILURE,
    /** The instance answered with an error. */
    ERROR
}
