package io.rota.client.channel;

/**
 * Options of rota's xDS policy ({@link RotaChannels#registerXdsPolicy(String, XdsPolicyOptions)}):
 * {@code XdsPolicyOptions.defaults().withTicketHeader(true)}.
 *
 * @param ticketHeader whether every RPC the policy routes carries its ticket in the
 *     {@value RotaChannels#TICKET_HEADER} header ({@code L<n>} for a local pick), as
 *     {@link RotaChannels#TICKET_HEADER_ENABLED} does for {@code rota:///} channels; default false
 */
public record XdsPolicyOptions(boolean ticketHeader) {
    /** The defaults: no ticket header. */
    public static XdsPolicyOptions defaults() {
        return new XdsPolicyOptions(false);
    }

    /** These options with the ticket header on or off. */
    public XdsPolicyOptions withTicketHeader(boolean on) {
        return new XdsPolicyOptions(on);
    }
}
