package rota

import (
	"maps"
	"net"
	"strconv"

	"github.com/rota-lb/rota/clients/go/rotapb"
)

// InstanceStatus says whether an instance may be picked.
type InstanceStatus int32

const (
	// StatusUnspecified is sent as "unset"; rota treats an announced instance without a
	// status as up.
	StatusUnspecified InstanceStatus = InstanceStatus(rotapb.InstanceStatus_INSTANCE_STATUS_UNSPECIFIED)
	// StatusUp instances are eligible for picks.
	StatusUp InstanceStatus = InstanceStatus(rotapb.InstanceStatus_UP)
	// StatusDraining instances stay registered but receive no new picks.
	StatusDraining InstanceStatus = InstanceStatus(rotapb.InstanceStatus_DRAINING)
	// StatusDown instances stay registered but are not eligible.
	StatusDown InstanceStatus = InstanceStatus(rotapb.InstanceStatus_DOWN)
)

// String returns the proto name of the status, such as "UP".
func (s InstanceStatus) String() string {
	return rotapb.InstanceStatus(s).String()
}

// Instance is one network endpoint of a service.
type Instance struct {
	// ID is unique within the service; empty means "host:port".
	ID string
	// Service is the service name: 1 to 253 bytes of [A-Za-z0-9._:-].
	Service string
	Host    string
	Port    uint32
	// Version isolates traffic: requests asking for a version go to instances of that
	// version. Empty means the instance serves requests that ask for no version.
	Version string
	Zone    string
	// Weight is the instance's share under the weighted rules. 0 means rota's default, 100;
	// to register weight 0 (the instance is never picked by weighted rules), set ZeroWeight.
	Weight uint32
	// ZeroWeight registers weight 0: the instance is registered and eligible for the other
	// rules but never picked by weighted ones. Weight must then be 0 (Register refuses an
	// instance with both). Instances read from rota (Instances, Watch) with weight 0 have it
	// set.
	ZeroWeight bool
	Metadata   map[string]string
	// Status is StatusUp when left unspecified.
	Status InstanceStatus
}

// Addr returns "host:port", ready for net.Dial or an HTTP URL.
func (i Instance) Addr() string {
	return net.JoinHostPort(i.Host, strconv.FormatUint(uint64(i.Port), 10))
}

// Ref names the instance within its service.
func (i Instance) Ref() InstanceRef {
	id := i.ID
	if id == "" {
		id = i.Addr()
	}
	return InstanceRef{Service: i.Service, ID: id}
}

// InstanceRef names one instance of one service.
type InstanceRef struct {
	Service string
	ID      string
}

func (i Instance) proto() *rotapb.Instance {
	pb := &rotapb.Instance{
		Id:       i.ID,
		Service:  i.Service,
		Host:     i.Host,
		Port:     i.Port,
		Version:  i.Version,
		Zone:     i.Zone,
		Metadata: maps.Clone(i.Metadata),
		Status:   rotapb.InstanceStatus(i.Status),
	}
	switch {
	case i.ZeroWeight:
		pb.Weight = new(uint32)
	case i.Weight != 0:
		w := i.Weight
		pb.Weight = &w
	}
	return pb
}

func instanceFromProto(pb *rotapb.Instance) Instance {
	i := Instance{
		ID:       pb.GetId(),
		Service:  pb.GetService(),
		Host:     pb.GetHost(),
		Port:     pb.GetPort(),
		Version:  pb.GetVersion(),
		Zone:     pb.GetZone(),
		Metadata: maps.Clone(pb.GetMetadata()),
		Status:   InstanceStatus(pb.GetStatus()),
	}
	if pb.Weight != nil {
		i.Weight = pb.GetWeight()
		i.ZeroWeight = i.Weight == 0
	}
	return i
}

// eligible reports whether rota would consider the instance for a pick.
func (i Instance) eligible() bool {
	return i.Status == StatusUp || i.Status == StatusUnspecified
}
