package io.rota.client.channel;

import com.google.common.net.InetAddresses;

/** One instance as the channel routes to it: its id, address, version and weight. */
record Member(String id, String host, int port, String version, int weight) {
    /**
     * {@code host:port}: how rota's xDS policy matches an instance of a lease to an endpoint xDS
     * gave it. Both sides build their members with {@link #canonicalHost}, so this is one concatenation.
     */
    String address() {
        return host + ":" + port;
    }

    /** An IP literal in its canonical form ({@code ::1}, brackets dropped); any other host as it is. */
    static String canonicalHost(String host) {
        String bare = host.length() > 1 && host.startsWith("[") && host.endsWith("]") ? host.substring(1, host.length() - 1) : host;
        return InetAddresses.isInetAddress(bare) ? InetAddresses.toAddrString(InetAddresses.forString(bare)) : host;
    }
}
