package cri

import (
	criapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berthcri/berth/internal/events"
)

// GetContainerEvents streams container lifecycle events until the client
// goes away. A client that falls more than events.DefaultBuffer events
// behind is cut off with ResourceExhausted so it knows to relist.
func (s *Service) GetContainerEvents(req *criapi.GetEventsRequest, stream criapi.RuntimeService_GetContainerEventsServer) error {
	sub := s.events.Subscribe(events.DefaultBuffer)
	defer sub.Unsubscribe()
	ctx := stream.Context()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-sub.C:
			if !ok {
				return eventsFellBehind()
			}
			if err := stream.Send(ev); err != nil {
				return err
			}
		}
	}
}
