// The `rota` load-balancing policy: one subchannel per instance, each call sent to the instance
// rota mapped the next leased ticket of its version to.

import { Metadata, connectivityState, status, type ChannelOptions } from '@grpc/grpc-js';
import {
  PickResultType,
  type ChannelControlHelper,
  type Endpoint,
  type LoadBalancer,
  type PickArgs,
  type PickResult,
  type Picker,
  type SubchannelInterface,
  type TypedLoadBalancingConfig,
} from '@grpc/grpc-js/build/src/experimental.js';
import type { StatusOr } from '@grpc/grpc-js/build/src/call-interface.js';

import { VERSION_HEADER } from '../version.js';
import { HoldOut } from './holdout.js';
import { Leaser, type Draw, type LeaseView, type Take } from './lease.js';
import type { RotaLink } from './link.js';
import { LINK_ATTRIBUTE, type KnownInstance, type ResolvedService } from './resolver.js';

export const POLICY_NAME = 'rota';
/**
 * Metadata naming the ticket a call was routed by: the ticket in decimal, or `L` and the local
 * counter for a call routed by the local rotation while rota was unreachable. Added only when
 * asked (channel option `rota.ticket_header`, or `"ticketHeader": true` in the policy config),
 * since it adds bytes to every call.
 */
export const TICKET_HEADER = 'x-rota-ticket';

/**
 * The policy's service-config entry: `{"rota": {"rule": "repeat(n=3)", "version": "v2"}}`.
 * `"report": false` turns off the reporting of call outcomes (they feed rota's statistics and
 * breakers; the leasable rules do not read them); `"ticketHeader": true` adds each call's
 * ticket as {@link TICKET_HEADER}.
 */
export class RotaLoadBalancingConfig implements TypedLoadBalancingConfig {
  constructor(
    readonly rule: string,
    readonly version: string,
    readonly report: boolean = true,
    readonly ticketHeader: boolean = false,
  ) {}

  getLoadBalancerName(): string {
    return POLICY_NAME;
  }

  toJsonObject(): object {
    return { [POLICY_NAME]: { rule: this.rule, version: this.version, report: this.report, ticketHeader: this.ticketHeader } };
  }

  static createFromJson(obj: unknown): RotaLoadBalancingConfig {
    const o = (obj ?? {}) as { rule?: unknown; version?: unknown; report?: unknown; ticketHeader?: unknown };
    // Any rule: rota says in its answer to the lease whether it can lease it.
    const rule = typeof o.rule === 'string' ? o.rule : '';
    const version = typeof o.version === 'string' ? o.version : '';
    return new RotaLoadBalancingConfig(rule, version, o.report !== false, o.ticketHeader === true);
  }
}

interface Sub {
  key: string;
  info: KnownInstance;
  subchannel: SubchannelInterface;
  state: connectivityState;
  /** The first connection attempt ended; until all have, calls wait rather than go elsewhere. */
  settled: boolean;
  /** Held out after calls in a row timed out; kept while the instance stays in the list. */
  holdOut: HoldOut;
}

/** A READY instance as a picker sees it: its subchannel and its hold. */
export interface Usable {
  readonly subchannel: SubchannelInterface;
  readonly holdOut: HoldOut;
}

export function subKey(id: string, addr: string): string {
  return `${id}\u0000${addr}`;
}

export class RotaLoadBalancer implements LoadBalancer {
  readonly #helper: ChannelControlHelper;
  readonly #subs = new Map<string, Sub>();
  #resolved: ResolvedService | undefined;
  #config = new RotaLoadBalancingConfig('', '');
  #leases: Leaser | undefined;
  #known: readonly KnownInstance[] = [];
  #watch = 0;
  #destroyed = false;

  constructor(helper: ChannelControlHelper) {
    this.#helper = helper;
  }

  updateAddressList(endpoints: StatusOr<Endpoint[]>, config: TypedLoadBalancingConfig, options: ChannelOptions): boolean {
    const resolved = options[LINK_ATTRIBUTE] as ResolvedService | undefined;
    if (!endpoints.ok) {
      if (this.#subs.size === 0) {
        this.#fail(endpoints.error.code, endpoints.error.details);
      }
      return true;
    }
    if (resolved === undefined) {
      this.#fail(status.FAILED_PRECONDITION, 'rota: the rota policy needs a rota:///SERVICE target');
      return false;
    }
    const c = config instanceof RotaLoadBalancingConfig ? config : new RotaLoadBalancingConfig('', '');
    if (this.#resolved?.link !== resolved.link || this.#config.rule !== c.rule) {
      this.#leases?.close();
      this.#leases = new Leaser(
        resolved.link,
        c.rule,
        () => this.#publish(),
        (v) => this.#localView(v),
        () => this.#unusableIds(),
      );
    }
    this.#resolved = resolved;
    this.#config = c;
    this.#known = resolved.instances;
    const seen = new Set<string>();
    let changed = false;
    for (const info of resolved.instances) {
      const key = subKey(info.id, info.addr);
      seen.add(key);
      const existing = this.#subs.get(key);
      if (existing !== undefined) {
        if (existing.info.version !== info.version || existing.info.weight !== info.weight) {
          existing.info = info;
          changed = true;
        }
        continue;
      }
      const [host, port] = splitAddr(info.addr);
      const subchannel = this.#helper.createSubchannel({ host, port }, options);
      const sub: Sub = { key, info, subchannel, state: connectivityState.IDLE, settled: false, holdOut: new HoldOut() };
      subchannel.ref();
      subchannel.addConnectivityStateListener((_s, _prev, next) => {
        if (this.#subs.get(key) !== sub || this.#destroyed) {
          return;
        }
        sub.state = next;
        if (next === connectivityState.READY || next === connectivityState.TRANSIENT_FAILURE) {
          sub.settled = true;
        }
        if (next === connectivityState.IDLE) {
          subchannel.startConnecting();
        }
        this.#publish();
      });
      this.#subs.set(key, sub);
      subchannel.startConnecting();
      changed = true;
    }
    for (const [key, sub] of this.#subs) {
      if (!seen.has(key)) {
        this.#subs.delete(key);
        sub.subchannel.unref();
        changed = true;
      }
    }
    if (changed || this.#watch !== resolved.watch) {
      this.#watch = resolved.watch;
      this.#leases!.invalidate();
    }
    this.#publish();
    return true;
  }

  exitIdle(): void {
    for (const sub of this.#subs.values()) {
      if (sub.state === connectivityState.IDLE) {
        sub.subchannel.startConnecting();
      }
    }
  }

  resetBackoff(): void {}

  destroy(): void {
    this.#destroyed = true;
    this.#leases?.close();
    for (const sub of this.#subs.values()) {
      sub.subchannel.unref();
    }
    this.#subs.clear();
  }

  getTypeName(): string {
    return POLICY_NAME;
  }

  #fail(code: status, details: string): void {
    const picker: Picker = {
      pick: (): PickResult => ({
        pickResultType: PickResultType.TRANSIENT_FAILURE,
        subchannel: null,
        status: { code, details, metadata: new Metadata() },
        onCallStarted: null,
        onCallEnded: null,
      }),
    };
    this.#helper.updateState(connectivityState.TRANSIENT_FAILURE, picker, details);
  }

  #publish(): void {
    if (this.#destroyed || this.#leases === undefined || this.#resolved === undefined) {
      return;
    }
    const ready = new Map<string, Usable>();
    let connecting = false;
    let unsettled = false;
    for (const sub of this.#subs.values()) {
      unsettled ||= !sub.settled;
      if (sub.state === connectivityState.READY) {
        ready.set(sub.key, sub);
      } else if (sub.state === connectivityState.IDLE || sub.state === connectivityState.CONNECTING) {
        connecting = true;
      }
    }
    const state = ready.size > 0 ? connectivityState.READY : connecting ? connectivityState.CONNECTING : connectivityState.TRANSIENT_FAILURE;
    const picker = new RotaPicker(this.#leases, {
      service: this.#resolved.link.service,
      version: this.#config.version,
      report: this.#config.report,
      ticketHeader: this.#config.ticketHeader,
      ready,
      connecting,
      unsettled,
    });
    this.#helper.updateState(state, picker, state === connectivityState.TRANSIENT_FAILURE ? 'no instance is reachable' : null);
  }

  /** The version's instances as the channel knows them, in id order (rota's isolation: else the unversioned). */
  #localView(version: string): LeaseView | undefined {
    const of = (v: string): LeaseView | undefined => {
      const members = this.#known.filter((i) => i.version === v).sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
      if (members.length === 0) {
        return undefined;
      }
      return { rule: this.#config.rule, ids: members.map((i) => i.id), addrs: members.map((i) => i.addr) };
    };
    return of(version) ?? (version === '' ? undefined : of(''));
  }

  /** The ids of the known instances the channel cannot use now: no subchannel of theirs READY and not held out. */
  #unusableIds(): string[] {
    const usable = new Set<string>();
    const all = new Set<string>();
    for (const sub of this.#subs.values()) {
      all.add(sub.info.id);
      if (sub.state === connectivityState.READY && sub.holdOut.usable()) {
        usable.add(sub.info.id);
      }
    }
    return [...all].filter((id) => !usable.has(id)).sort();
  }
}

function splitAddr(addr: string): [string, number] {
  const i = addr.lastIndexOf(':');
  const host = addr.slice(0, i).replace(/^\[(.*)\]$/, '$1');
  return [host, Number(addr.slice(i + 1))];
}

const QUEUE: PickResult = { pickResultType: PickResultType.QUEUE, subchannel: null, status: null, onCallStarted: null, onCallEnded: null };

/** What a picker needs of the channel's lease streams (a {@link Leaser}). */
export interface PickerLeases {
  stream(version: string): { take(): Take };
  readonly link: Pick<RotaLink, 'report'>;
}


/** Codes only a server may send (gRFC A54): grpc-js fails a call a picker fails with one of them as INTERNAL "Invalid status from control plane". */
const SERVER_ONLY: ReadonlySet<status> = new Set([
  status.INVALID_ARGUMENT,
  status.NOT_FOUND,
  status.ALREADY_EXISTS,
  status.FAILED_PRECONDITION,
  status.ABORTED,
  status.OUT_OF_RANGE,
  status.DATA_LOSS,
]);

/** The status a call fails with when rota refused its lease: rota's own code, or UNAVAILABLE (with rota's message) for a code only a server may send. */
export function callStatus(code: status): status {
  return SERVER_ONLY.has(code) ? status.UNAVAILABLE : code;
}

/** The picker's settings, fixed for its life. */
export interface PickerOptions {
  service: string;
  version: string;
  report: boolean;
  ticketHeader: boolean;
  /** READY instances by {@link subKey}. */
  ready: ReadonlyMap<string, Usable>;
  /** Some instance is connecting: with none usable, a call waits rather than fails. */
  connecting: boolean;
  /** Some instance has not finished its first connection attempt: every call waits. */
  unsettled: boolean;
}

export class RotaPicker implements Picker {
  readonly #o: PickerOptions;

  constructor(
    readonly leases: PickerLeases,
    options: PickerOptions,
  ) {
    this.#o = options;
  }

  pick(args: PickArgs): PickResult {
    const o = this.#o;
    if (o.unsettled) {
      return QUEUE;
    }
    const asked = args.metadata.get(VERSION_HEADER)[0];
    const version = typeof asked === 'string' ? asked : o.version;
    const stream = this.leases.stream(version);
    let draw: Draw;
    let position: number;
    let target: Usable | undefined;
    // The view whose instances were found to have one usable, for the skips of this pick.
    let checked: LeaseView | undefined;
    for (;;) {
      const taken = stream.take();
      if (taken.kind !== 'ticket') {
        return taken.kind === 'wait' ? QUEUE : this.#failure(taken.code, taken.details);
      }
      draw = taken.draw;
      const view = draw.view;
      if (draw.position === undefined) {
        // The local rotation over a ticket range (rota unreachable): the counter turned over
        // the usable instances in id order.
        const usable = view.ids.flatMap((_, p) => (this.#usable(view, p) !== undefined ? [p] : []));
        if (usable.length === 0) {
          return this.#noneUsable();
        }
        position = usable[Number(draw.ticket % BigInt(usable.length))]!;
        target = this.#usable(view, position)!;
        break;
      }
      // The instance rota mapped the ticket (or the pick) to. When it is unusable (not READY,
      // or held out for timeouts), the call takes the next ticket of the stream: the skipped
      // one is a gap, like a ticket another consumer drew, and since the next tickets follow
      // rota's own sequence the usable instances keep the rule's shares among themselves. The
      // stream stops handing out tickets (the call waits) once its blocks are spent, so this
      // ends. When no instance of the block's list (of a block of picks: that it names) is
      // usable, the call waits (or fails) rather than spending the block.
      position = draw.position;
      target = this.#usable(view, position);
      if (target !== undefined) {
        break;
      }
      if (checked !== view || draw.named !== undefined) {
        const candidates = draw.named ?? view.ids.map((_, p) => p);
        if (!candidates.some((p) => this.#usable(view, p) !== undefined)) {
          return this.#noneUsable();
        }
        checked = draw.named === undefined ? view : undefined;
      }
    }
    if (o.ticketHeader) {
      args.metadata.set(TICKET_HEADER, (draw.local ? 'L' : '') + draw.ticket.toString());
    }
    const holdOut = target.holdOut;
    const generation = holdOut.generation;
    if (!o.report) {
      return {
        pickResultType: PickResultType.COMPLETE,
        subchannel: target.subchannel,
        status: null,
        onCallStarted: null,
        onCallEnded: (code: status) => holdOut.ended(generation, code),
      };
    }
    const id = draw.view.ids[position]!;
    const ticket = draw.local ? '0' : draw.ticket.toString();
    const rule = draw.local ? '' : draw.view.rule;
    const link = this.leases.link;
    const service = o.service;
    const started = performance.now();
    return {
      pickResultType: PickResultType.COMPLETE,
      subchannel: target.subchannel,
      status: null,
      onCallStarted: null,
      onCallEnded: (code: status) => {
        holdOut.ended(generation, code);
        if (code === status.CANCELLED) {
          return;
        }
        link.report({
          service,
          instanceId: id,
          ticket,
          rule,
          latencyUs: Math.round((performance.now() - started) * 1000).toString(),
          result: code === status.OK ? 'CALL_RESULT_OK' : code === status.UNAVAILABLE ? 'CALL_RESULT_CONNECT_FAILURE' : 'CALL_RESULT_ERROR',
        });
      },
    };
  }

  /** The instance at `position` when the call may go to it: READY and not held out. */
  #usable(view: LeaseView, position: number): Usable | undefined {
    const entry = this.#o.ready.get(subKey(view.ids[position]!, view.addrs[position]!));
    return entry !== undefined && entry.holdOut.usable() ? entry : undefined;
  }

  #noneUsable(): PickResult {
    return this.#o.connecting ? QUEUE : this.#failure(status.UNAVAILABLE, `rota: no instance of "${this.#o.service}" is reachable`);
  }

  #failure(code: status, details: string): PickResult {
    return {
      pickResultType: PickResultType.TRANSIENT_FAILURE,
      subchannel: null,
      status: { code: callStatus(code), details, metadata: new Metadata() },
      onCallStarted: null,
      onCallEnded: null,
    };
  }
}
