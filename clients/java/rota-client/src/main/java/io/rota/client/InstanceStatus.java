package io.rota.client;

/** Whether an instance gets picks. */
public enum InstanceStatus {
    /** Eligible for picks (the status of an instance announced without one). */
    UP,
    /** Registered but gets no new picks (finishing its in-flight work). */
    DRAINING,
    /** Registered but not eligible (for example failing its own health check). */
    DOWN
}
